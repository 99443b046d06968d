r"""A wall-clock sampler of the main thread for bench/larger_than_memory.py's passes.

    PYTHONPATH=bench/main_thread_sampler:$PYTHONPATH MP_SAMPLE_OUT=/tmp/prof \
        python bench/larger_than_memory.py ... --passes compute,full

Python imports ``sitecustomize`` at start-up from the path, so every pass
(a subprocess run with ``--mode``) samples its main thread's stack every 2 ms
(every ~5 ms, the GIL's switch interval, while that thread runs Python) and writes ``profile-MODE.txt`` to ``$MP_SAMPLE_OUT`` at exit: the share of
samples in each function (inclusive) and at each line (where the thread was).
Unlike cProfile it counts time blocked in C code (CUDA waits, numpy, IO) and
slows the pass little. Without ``MP_SAMPLE_OUT`` it does nothing.
"""

import atexit
import collections
import os
import sys
import threading

if "--mode" in sys.argv and os.environ.get("MP_SAMPLE_OUT"):
    _main = threading.main_thread().ident
    _inclusive, _leaf, _samples = collections.Counter(), collections.Counter(), [0]
    _stop = threading.Event()

    def _key(frame) -> str:
        code = frame.f_code
        return f"{os.path.basename(code.co_filename)}:{code.co_name}:{code.co_firstlineno}"

    def _sample() -> None:
        while not _stop.wait(0.002):
            frame = sys._current_frames().get(_main)
            if frame is None:
                continue
            _samples[0] += 1
            _leaf[f"{_key(frame)}@{frame.f_lineno}"] += 1
            seen = set()
            while frame is not None:  # a recursive function counts once per sample
                key = _key(frame)
                if key not in seen:
                    _inclusive[key] += 1
                    seen.add(key)
                frame = frame.f_back

    threading.Thread(target=_sample, daemon=True).start()

    @atexit.register
    def _write() -> None:
        _stop.set()
        mode = sys.argv[sys.argv.index("--mode") + 1]
        total = max(_samples[0], 1)
        lines = [f"{_samples[0]} samples", "## inclusive"]
        lines += [f"{100 * n / total:6.1f}%  {key}" for key, n in _inclusive.most_common(60)]
        lines += ["## leaf (line)"] + [f"{100 * n / total:6.1f}%  {key}" for key, n in _leaf.most_common(40)]
        with open(os.path.join(os.environ["MP_SAMPLE_OUT"], f"profile-{mode}.txt"), "w") as out:
            out.write("\n".join(lines) + "\n")
