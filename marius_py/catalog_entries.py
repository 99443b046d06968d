"""The registry's built-in datasets (``marius_py.catalog``). URLs are pinned to a commit where the source is a
repository, so that a published SHA-256 stays true; each digest was computed from a copy of that file
(the repository's own, read through its git objects), and the counts checked on it.
"""

from __future__ import annotations

from dataclasses import replace

from marius_py.catalog import DATASETS, DatasetSource, Download, Stats
from marius_py.errors import MariusInputError
from marius_py.ogb import OgbLayout

_SPLITS = ("train", "valid", "test")
_CONVE = "https://raw.githubusercontent.com/TimDettmers/ConvE/f3c0eb286025410fa5b4c04696c918264163d0ca"
_CODEX = "https://raw.githubusercontent.com/tsafavi/codex/3132e426c2a6b643b70bad679905a3a6270be440/data/triples"
_PYKEEN = ("https://raw.githubusercontent.com/pykeen/pykeen/05c7bbb20c952f3e5e958e694344ace4005b1bbb/src/pykeen/"
           "datasets")


def _in_archive(archive: str, prefix: str = "") -> dict[str, str]:
    return {split: f"{archive}!{prefix}{split}.txt" for split in _SPLITS}


def _register_split_files(name: str, base: str, stats: Stats, digests: dict[str, str | None], **about) -> None:
    """A dataset served as one file per split (``base/SPLIT.txt``, named ``NAME-SPLIT.txt`` in the cache)."""
    downloads = tuple(Download(f"{base}/{split}.txt", f"{name}-{split}.txt", sha256=digests[split])
                      for split in _SPLITS)
    DATASETS.register(name, DatasetSource(task="link_prediction", downloads=downloads, stats=stats,
                                          splits={split: f"{name}-{split}.txt" for split in _SPLITS}, **about))


DATASETS.register("fb15k-237", DatasetSource(
    task="link_prediction",
    downloads=(Download(f"{_CONVE}/FB15k-237.tar.gz",
                        sha256="311df7930f842a02979eaa7a802484a6afe62303c07f915f1e6edbc30cbe05e8", size=3678603),),
    splits=_in_archive("FB15k-237.tar.gz"),
    stats=Stats(nodes=14541, relations=237, train=272115, valid=17535, test=20466,
                where="Toutanova and Chen (2015), Table 1"),
    license="Microsoft Research Data License Agreement: non-commercial research use only", restricts_use=True,
    citation="Toutanova and Chen. Observed versus latent features for knowledge base and text inference. "
             "CVSC 2015",
    homepage="https://www.microsoft.com/en-us/download/details.aspx?id=52312",
    notes="ConvE's copy of the release's train/valid/test (CRLF lines)"))

DATASETS.register("wn18rr", DatasetSource(
    task="link_prediction",
    downloads=(Download(f"{_CONVE}/WN18RR.tar.gz",
                        sha256="1eb9152f804c140d163462c0d49f65e5a0b30ab5fbb375c5e3353c11a6249060", size=892861),),
    splits=_in_archive("WN18RR.tar.gz"),
    stats=Stats(nodes=40943, relations=11, train=86835, valid=3034, test=3134,
                where="Dettmers et al. (2018), Table 2"),
    license="WordNet 3.0 license (data); ConvE repository: MIT",
    citation="Dettmers, Minervini, Stenetorp and Riedel. Convolutional 2D knowledge graph embeddings. AAAI 2018",
    homepage="https://github.com/TimDettmers/ConvE"))

_CODEX_ABOUT = dict(license="MIT (code and data; facts from Wikidata, CC0)",
                   citation="Safavi and Koutra. CoDEx: A comprehensive knowledge graph completion benchmark. "
                            "EMNLP 2020",
                   homepage="https://github.com/tsafavi/codex")
_register_split_files("codex-s", f"{_CODEX}/codex-s", Stats(nodes=2034, relations=42, train=32888, valid=1827,
                                                             test=1828, where="Safavi and Koutra (2020), Table 2"),
                      {"train": "64f93b7f314f3936a6f65739721429db3f6a7c8f5a1e1104ec3bb544f7434f59",
                       "valid": "3831c0e57daef03c3a18cdd1a72e370b496f696c5218883d35c7d2ab8a6a772c",
                       "test": "27127fcb34688c4778e88a39ef3c9b540807da846021e9d9685660ac1838aca1"}, **_CODEX_ABOUT)
_register_split_files("codex-l", f"{_CODEX}/codex-l", Stats(nodes=77951, relations=69, train=551193, valid=30622,
                                                             test=30622, where="Safavi and Koutra (2020), Table 2"),
                      {"train": None,  # (too large for the copy the digests were computed from: recorded at first)
                       "valid": "f0119a22dc663e8df4a942cde7404927935b0c42e5a8980f5fb48ac6886e416f",
                       "test": "2d8188d6f199fc548c8e5fb97336a7ffd079240fc84c0425ed9c29d39bfdab8d"}, **_CODEX_ABOUT)
_register_split_files("codex-m", f"{_CODEX}/codex-m", Stats(nodes=17050, relations=51, train=185584, valid=10310,
                                                             test=10311, where="Safavi and Koutra (2020), Table 2"),
                      {"train": "d99c3437ab51690391a26d96976adf6e5494dba7ef6902e77000551bfa566556",
                       "valid": "11c323096367354940846b9ed940c5dabddc1d20a70474222babe7e7fd28b28d",
                       "test": "0575ce05e4ce915e395bb4f708e8df9547989dd4c8c71407cbfd78c19daffcf7"}, **_CODEX_ABOUT)

_PYKEEN_ABOUT = dict(license="MIT (PyKEEN's split)",
                     citation="Kok and Domingos. Statistical predicate invention. ICML 2007 (the split: Ali et al., "
                              "PyKEEN 1.0, JMLR 2021)",
                     homepage="https://github.com/pykeen/pykeen")
_PYKEEN_COUNTS = "PyKEEN's split (counts of its files)"
_register_split_files("nations", f"{_PYKEEN}/nations", Stats(nodes=14, relations=55, train=1592, valid=199, test=201,
                                                              where=_PYKEEN_COUNTS),
                      {"train": "0830fa9da8e5bba2ccdaa45b7bdc9130451ba66b09ff2708f35fccaf82473e57",
                       "valid": "2b337a62e51a2f45c283eac98a70d21b7e0e102136be1539b2a52c652a7b0530",
                       "test": "3971085165b47b6aeaec68058c6d8d98b3005e929db81268410b95ae4db770ab"}, **_PYKEEN_ABOUT)
_register_split_files("kinships", f"{_PYKEEN}/kinships", Stats(nodes=104, relations=25, train=8544, valid=1068,
                                                                test=1074, where=_PYKEEN_COUNTS),
                      {"train": "738612111a6acf0e39662bde24c7e72a4d1edf20931beea077da367dda689731",
                       "valid": "c56f8630a583178b1e569f11a64aa535ae1ce0b0912d8b1e24716be2b37f04da",
                       "test": "05e5733265761d55be9c05bfaff5a8d0808df46f9c1e9d66cc3f2fe114e43d88"}, **_PYKEEN_ABOUT)
_register_split_files("umls", f"{_PYKEEN}/umls", Stats(nodes=135, relations=46, train=5216, valid=652, test=661,
                                                        where=_PYKEEN_COUNTS),
                      {"train": "873ef4925516b83e7f6f8cc02b4be51d848828710a7f65a956f0ac4a9e452f35",
                       "valid": "025c98f8a4891e2a6582ec5b40ee0d904031edad9c52554522f4b7904820c98e",
                       "test": "a7eb529a3d2810fcc96341ccc97c625a5e202f8389673aa6bd317eeebbb79014"}, **_PYKEEN_ABOUT)


_TRANSE_HOME = "https://everest.hds.utc.fr/doku.php?id=en:transe"
DATASETS.register("fb15k", DatasetSource(
    task="link_prediction",
    downloads=(Download("https://everest.hds.utc.fr/lib/exe/fetch.php?media=en:fb15k.tgz", "fb15k.tgz",
                        mirrors=("https://dl.fbaipublicfiles.com/starspace/fb15k.tgz",)),),
    splits={split: f"fb15k.tgz!FB15k/freebase_mtr100_mte100-{split}.txt" for split in _SPLITS},
    stats=Stats(nodes=14951, relations=1345, train=483142, valid=50000, test=59071,
                where="Bordes et al. (2013), Table 1"),
    license="derived from Freebase (CC BY); no license stated for the split",
    citation="Bordes, Usunier, Garcia-Duran, Weston and Yakhnenko. Translating embeddings for modeling "
             "multi-relational data. NeurIPS 2013",
    homepage=_TRANSE_HOME, notes="the mirror is Marius's source; no digest is published for either"))

DATASETS.register("wn18", DatasetSource(
    task="link_prediction",
    downloads=(Download("https://everest.hds.utc.fr/lib/exe/fetch.php?media=en:wordnet-mlj12.tar.gz",
                        "wordnet-mlj12.tar.gz"),),
    splits={split: f"wordnet-mlj12.tar.gz!wordnet-mlj12/wordnet-mlj12-{split}.txt" for split in _SPLITS},
    stats=Stats(nodes=40943, relations=18, train=141442, valid=5000, test=5000,
                where="Bordes et al. (2014); PyKEEN and DGL-KE list the same"),
    license="WordNet 3.0 license (Princeton); no license stated for the split",
    citation="Bordes, Glorot, Weston and Bengio. A semantic matching energy function for learning with "
             "multi-relational data. Machine Learning 2014",
    homepage=_TRANSE_HOME))

DATASETS.register("yago3-10", DatasetSource(
    task="link_prediction",
    downloads=(Download(f"{_CONVE}/YAGO3-10.tar.gz"),),
    splits=_in_archive("YAGO3-10.tar.gz"),
    stats=Stats(nodes=123182, relations=37, train=1079040, valid=5000, test=5000,
                where="Dettmers et al. (2018), Table 2"),
    license="YAGO3: CC BY 3.0",
    citation="Mahdisoltani, Biega and Suchanek. YAGO3: a knowledge base from multilingual Wikipedias. CIDR 2015 "
             "(the YAGO3-10 split: Dettmers et al., AAAI 2018)",
    homepage="https://github.com/TimDettmers/ConvE"))

# A graph without a published split: split 90/5/5 by preprocessing, with its seed, as Marius splits them.
_SEEDED_SPLIT = dict(split=(0.05, 0.05), notes="no published split: 90/5/5 drawn with preprocessing's seed",
                     protocol="filtered (a seeded random split)")

DATASETS.register("hetionet", DatasetSource(
    task="link_prediction",
    downloads=(Download("https://github.com/hetio/hetionet/raw/8a6cc0c5604d0e2908786e4de38af67b8e46ee4a/hetnet/tsv/"
                        "hetionet-v1.0-edges.sif.gz",
                        sha256="611f0411ac666be4e0270e54bbca67407e14720bfc3099311f0f5eec25c5a947", size=12401407),),
    splits={"train": "hetionet-v1.0-edges.sif.gz"}, skip_header=1,
    stats=Stats(nodes=47031, relations=24, edges=2250197, where="the Hetionet README (v1.0)"),
    license="CC0 1.0 for Hetionet's own content; its sources keep their licenses",
    citation="Himmelstein et al. Systematic integration of biomedical knowledge prioritizes drugs for "
             "repurposing. eLife 2017",
    homepage="https://het.io/", **_SEEDED_SPLIT))

DATASETS.register("drkg", DatasetSource(
    task="link_prediction",
    downloads=(Download("https://dgl-data.s3-us-west-2.amazonaws.com/dataset/DRKG/drkg.tar.gz",
                        mirrors=("https://s3.us-west-2.amazonaws.com/dgl-data/dataset/DRKG/drkg.tar.gz",)),),
    splits={"train": "drkg.tar.gz!drkg.tsv"},
    stats=Stats(nodes=97238, relations=107, edges=5874261, where="the DRKG README"),
    license="Apache-2.0 (the project); its sources keep theirs, some non-commercial (CC BY-NC 4.0)",
    restricts_use=True,
    citation="Ioannidis et al. DRKG: Drug Repurposing Knowledge Graph for Covid-19. 2020",
    homepage="https://github.com/gnn4dr/DRKG", **_SEEDED_SPLIT))

DATASETS.register("freebase86m", DatasetSource(
    task="link_prediction",
    downloads=(Download("https://data.dgl.ai/dataset/Freebase.zip"),),
    splits=_in_archive("Freebase.zip", "Freebase/"), columns=(0, 2, 1),  # (lines are head, tail, relation)
    stats=Stats(nodes=86054151, relations=14824, train=304727650, valid=16929318, test=16929308,
                where="DGL-KE's documentation and Marius's dataset statistics"),
    license="derived from Freebase (CC BY); no license stated for the split",
    citation="Zheng et al. DGL-KE: training knowledge graph embeddings at scale. SIGIR 2020 (used by Mohoney et "
             "al., Marius, OSDI 2021)",
    homepage="https://github.com/awslabs/dgl-ke"))

DATASETS.register("livejournal", DatasetSource(
    task="graph",
    downloads=(Download("https://snap.stanford.edu/data/soc-LiveJournal1.txt.gz"),),
    splits={"train": "soc-LiveJournal1.txt.gz"}, pairs=True, skip_header=4,
    stats=Stats(nodes=4847571, edges=68993773, where="SNAP's page for soc-LiveJournal1"),
    license="SNAP: no license stated (research use)",
    citation="Backstrom, Huttenlocher, Kleinberg and Lan. Group formation in large social networks. KDD 2006; "
             "Leskovec and Krevl. SNAP Datasets, 2014",
    homepage="https://snap.stanford.edu/data/soc-LiveJournal1.html",
    **_SEEDED_SPLIT))

DATASETS.register("twitter", DatasetSource(
    task="graph",
    downloads=(Download("https://snap.stanford.edu/data/twitter-2010.txt.gz"),),
    splits={"train": "twitter-2010.txt.gz"}, delimiter=" ", pairs=True,
    stats=Stats(nodes=41652230, edges=1468365182, where="the LAW twitter-2010 page"),
    license="LAW / SNAP: no license stated (research use)",
    citation="Kwak, Lee, Park and Moon. What is Twitter, a social network or a news media? WWW 2010",
    homepage="https://snap.stanford.edu/data/twitter-2010.html",
    **_SEEDED_SPLIT))


_OGB = "http://snap.stanford.edu/ogb/data/linkproppred"
_OGB_ABOUT = dict(license="CC0 1.0 (OGB)", protocol="given",
                  citation="Hu, Fey, Zitnik, Dong, Ren, Liu, Catasta and Leskovec. Open Graph Benchmark: datasets "
                           "for machine learning on graphs. NeurIPS 2020")


def _register_ogb(name: str, archive: str, split_folder: str, layout: OgbLayout, stats: Stats, **about) -> None:
    """An OGB link-prediction dataset: its zip (no digest published: the first download records one), the
    split files in it, and the negatives its valid and test edges are ranked against (``marius_py.ogb``)."""
    folder = archive.removesuffix(".zip")
    DATASETS.register(name, DatasetSource(
        task="link_prediction", downloads=(Download(f"{_OGB}/{archive}", mirrors=(f"{_OGB.replace('http:', 'https:')}"
                                                                                   f"/{archive}",)),),
        splits={split: f"{archive}!{folder}/split/{split_folder}/{split}.pt" for split in _SPLITS},
        ogb=layout, stats=stats, homepage=f"https://ogb.stanford.edu/docs/linkprop/#{name}",
        **{**_OGB_ABOUT, **about}))


_register_ogb("ogbl-wikikg2", "wikikg-v2.zip", "time",
              OgbLayout(num_nodes="wikikg-v2.zip!wikikg-v2/raw/num-node-list.csv.gz"),
              Stats(nodes=2500604, relations=535, train=16109182, valid=429456, test=598543,
                    where="OGB's documentation; the split's counts as PyKEEN lists them"),
              notes="valid and test edges ranked against 500 given heads and 500 given tails (evaluation.protocol="
                    "given)")
_register_ogb("ogbl-biokg", "biokg.zip", "random",
              OgbLayout(num_nodes="biokg.zip!biokg/raw/num-node-dict.csv.gz", typed=True),
              Stats(nodes=93773, relations=51, train=4762678, valid=162886, test=162870,
                    where="OGB's documentation; the split's counts as Marius lists them"),
              notes="node ids are TYPE:ID; the given negatives are of the answer's type")
_register_ogb("ogbl-citation2", "citation-v2.zip", "time",
              OgbLayout(num_nodes="citation-v2.zip!citation-v2/raw/num-node-list.csv.gz", pairs=True),
              Stats(nodes=2927963, edges=30561187, where="OGB's documentation"), license="ODC-BY (OGB)",
              notes="a plain graph; each valid and test source ranks its true target against 1,000 given targets")


_LSC = "wikikg90m-v2.zip!wikikg90m-v2/"
DATASETS.register("wikikg90mv2", DatasetSource(
    task="link_prediction",
    downloads=(Download("https://dgl-data.s3-accelerate.amazonaws.com/dataset/OGB-LSC/wikikg90m-v2.zip",
                        md5="bfd6257134b7eb59e2edc0a4af21faa8",
                        mirrors=("http://ogb-data.stanford.edu/data/lsc/wikikg90m-v2.zip",)),),
    splits={"train": f"{_LSC}processed/train_hrt.npy", "valid": f"{_LSC}processed/val_hr.npy",
            "test": f"{_LSC}processed/val_hr.npy"},
    ogb=OgbLayout(num_nodes=f"{_LSC}meta.pt", valid_tails=f"{_LSC}processed/val_t.npy"),
    stats=Stats(nodes=91230610, relations=1387, train=601062811, valid=15000, test=15000,
                where="OGB-LSC's WikiKG90Mv2 documentation (its triples are the train split)"),
    license="CC0 1.0 (OGB-LSC)", protocol="top10",
    citation="Hu, Fey, Ren, Nakata, Dong and Leskovec. OGB-LSC: a large-scale challenge for machine learning on "
             "graphs. NeurIPS 2021 Datasets and Benchmarks",
    homepage="https://ogb.stanford.edu/docs/lsc/wikikg90mv2/",
    notes="the test tails are hidden: the valid split stands for test too, as Marius does; its tails are ranked "
          "against all entities with MRR counted to the top 10 (evaluation.protocol=top10); preparing it reads "
          "601M triples through preprocessing's name dictionaries (hours, tens of GB of memory)"))

_PLANETOID = "https://raw.githubusercontent.com/kimiyoung/planetoid/af6abf468a772cc055bec88c52e4d6f51b7c37e3/data"
_PLANETOID_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def _register_planetoid(name: str, digests: tuple[str | None, ...], stats: Stats) -> None:
    """A Planetoid citation graph (node classification): its eight files, kept as downloaded."""
    downloads = tuple(Download(f"{_PLANETOID}/ind.{name}.{part}", sha256=digest)
                      for part, digest in zip(_PLANETOID_PARTS, digests))
    parts = {"train_features": "x", "train_labels": "y", "features": "allx", "labels": "ally",
             "test_features": "tx", "test_labels": "ty", "edges": "graph", "test_nodes": "test.index"}
    DATASETS.register(name, DatasetSource(
        task="node_classification", downloads=downloads, splits={}, stats=stats, license="MIT (Planetoid)",
        node_files={part: f"ind.{name}.{file}" for part, file in parts.items()},
        citation="Yang, Cohen and Salakhutdinov. Revisiting semi-supervised learning with graph embeddings. "
                 "ICML 2016 (data: Sen et al., AI Magazine 2008)",
        homepage="https://github.com/kimiyoung/planetoid", protocol="accuracy on the Planetoid split",
        notes="Python 2 pickles (scipy sparse features, one-hot labels, an adjacency dict) and the test nodes"))


_PLANETOID_COUNTS = "PyG's Planetoid table (edges: both directions); the Planetoid split"
_register_planetoid("cora", (
    "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
    "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875"),
    Stats(nodes=2708, edges=10556, features=1433, classes=7, train=140, valid=500, test=1000,
          where=_PLANETOID_COUNTS))
_register_planetoid("citeseer", (
    "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
    "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
    "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
    "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
    "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
    "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
    "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
    "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4"),
    Stats(nodes=3327, edges=9104, features=3703, classes=6, train=120, valid=500, test=1000,
          where=_PLANETOID_COUNTS))
_register_planetoid("pubmed", (
    "fbe9cb5c47200d1b7769a26e579be3b7130b556831f9d850e77c4c74f2599b33",
    "4eb5f5d0f30f26497eb0ac6ac9719d09c67e284f1ed0385c93f3ef27a671da3d",
    None,  # (ind.pubmed.allx: too large for the copy the others were computed from: recorded at first)
    "e6c807633307a07ed659249006536a147c7999c797f11a2560752990181b41b3",
    "ee2e0d4819d9fbcc403689c3bf2e49face401b605932f093bc58ab6461130fdd",
    "0c37bbe3b5014ec365e9d393cf4791925e5ed94fb194305d74f064a8d7b50f0e",
    "5b89f0036ca22909471f1e6558eb42fa06e0c730a577bde5b058b40638f81dc9",
    "b101d421688bbaecbd82e8a18f1e282378d6830f3a37666f28ebc47f844341b5"),
    Stats(nodes=19717, edges=88648, features=500, classes=3, train=60, valid=500, test=1000,
          where=_PLANETOID_COUNTS))

_OGBN = "http://snap.stanford.edu/ogb/data/nodeproppred"
_OGBN_SPLITS = {"products.zip": "sales_ranking"}


def _ogbn_files(archive: str) -> dict[str, str]:
    """Where an ogbn archive keeps its parts (papers100M's are binary: raw/data.npz and raw/node-label.npz)."""
    root = f"{archive}!{archive.removesuffix('.zip')}/"
    split = f"{root}split/{_OGBN_SPLITS.get(archive, 'time')}/"
    nodes = {f"{part}_nodes": f"{split}{part}.csv.gz" for part in _SPLITS}
    if archive.startswith("papers100M"):
        return {"graph": f"{root}raw/data.npz", "labels": f"{root}raw/node-label.npz", **nodes}
    return {"edges": f"{root}raw/edge.csv.gz", "features": f"{root}raw/node-feat.csv.gz",
            "labels": f"{root}raw/node-label.csv.gz", **nodes}
for _name, _archive, _stats, _license in (
        ("ogbn-arxiv", "arxiv.zip", Stats(nodes=169343, edges=1166243, features=128, classes=40, train=90941,
                                          valid=29799, test=48603), "ODC-BY (OGB)"),
        ("ogbn-products", "products.zip", Stats(nodes=2449029, edges=61859140, features=100, classes=47,
                                                train=196615, valid=39323, test=2213091),
         "Amazon's license for its review data (OGB)"),
        ("ogbn-papers100m", "papers100M-bin.zip", Stats(nodes=111059956, edges=1615685872, features=128,
                                                        classes=172, train=1207179, valid=125265, test=214338),
         "ODC-BY (OGB)")):
    DATASETS.register(_name, DatasetSource(
        task="node_classification",
        downloads=(Download(f"{_OGBN}/{_archive}", mirrors=(f"{_OGBN.replace('http:', 'https:')}/{_archive}",)),),
        splits={}, stats=replace(_stats, where="OGB's documentation and master.csv"), license=_license,
        node_files=_ogbn_files(_archive),
        citation=_OGB_ABOUT["citation"], homepage=f"https://ogb.stanford.edu/docs/nodeprop/#{_name}",
        protocol="accuracy on OGB's split", notes="raw/*.csv.gz (edges, features, labels) and split/*/*.csv.gz"))


def registered(name: object) -> DatasetSource | None:
    """The entry ``name`` (built-in, or registered by research code), or None."""
    return DATASETS.get(name) if name in DATASETS else None


def closest_names(name: str) -> list[str]:
    """Registered names close to ``name`` (case and separators aside), closest first."""
    import difflib
    folded = {entry.lower().replace("_", "-"): entry for entry in DATASETS.names()}
    return [folded[match] for match in difflib.get_close_matches(str(name).lower().replace("_", "-"), folded, 3, 0.6)]


def unknown_dataset(name: str, setting: str = "dataset") -> MariusInputError:
    """The error of a name the registry does not have, suggesting the closest ones."""
    close = closest_names(name)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return MariusInputError(f"{setting}: unknown dataset {name!r}{hint}",
                            expected="a registered dataset (`marius-py datasets` lists them), or research code's "
                                     "own registered with marius_py.catalog.DATASETS.register(name, ...)")
