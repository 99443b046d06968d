"""On-disk node-embedding store, edge-bucket store and (later) the partition buffer.

Knows nothing of models or the CLI; depends on numpy, h5py and zarr only.
"""
