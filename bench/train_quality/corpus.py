"""The experiment's text: the Python standard library sources that Debian 12 ships
(libpython3.11-minimal and libpython3.11-stdlib, which every Debian 12 with python3 has:
python3 -> python3.11 -> libpython3.11-stdlib -> libpython3.11-minimal; scripts/install-deps.sh
installs python3). Nobody here wrote them.

The file list comes from dpkg (`dpkg-query -L`), not from a glob of /usr/lib/python3.11, so files
that other packages drop there (python3-distutils, python3-lib2to3, a venv package, ...) do not
change the corpus. Every `*.py` file the two packages own under /usr/lib/python3.11 is used,
sorted by path, except generated files (EXCLUDED_RULE):

- `pydoc_data/topics.py`: the documentation's prose, generated into one 750 KB Python string by
  Doc/tools/extensions/pyspecific.py; not source code.
- the charmap codec tables under `encodings/`: every `encodings/*.py` that defines a module-level
  `decoding_table` or `decoding_map` (70 files in Debian 12's 3.11: cp*.py with 256-entry tables,
  mac_*.py, iso8859_*.py, koi8_r/t/u, kz1048, hp_roman8, palmos, ptcp154, tis_620), written by
  Tools/unicode/gencodec.py or genwincodec.py or copied from one. They are near-identical copies of
  each other, so whichever split a table falls in, its near twins sit in the other and the
  held-out loss would measure memorised tables. The CJK codecs (cp932, cp949, cp950, ...), which
  are a few lines calling _codecs_*, stay.

The exclusion is a rule over the files' paths and contents (listed in the corpus info as
`excluded`), so another Python 3.11 build applies the same rule. Other generated files (token.py,
stringprep.py, re/_casefix.py) are single files with no twin in the other split, and stay.

Held-out split by file: a file is held out when the first byte of SHA-256 of its path relative to
/usr/lib/python3.11 is below HELD_OUT_BELOW (26/256: about 10% of the files). The split depends on
nothing but the path.

Each split is the files' bytes one after the other (sorted by path), each followed by a blank
line, as one uint8 tensor: the model reads bytes (a vocabulary of 256). Training batches are
random windows of the training split. Evaluation windows are stratified by file (eval_windows):
each held-out file long enough for a window gets an equal share of them, so no single large file
decides the held-out loss."""

import hashlib
import os
import re
import subprocess

import torch

ROOT = "/usr/lib/python3.11"
PACKAGES = ("libpython3.11-minimal", "libpython3.11-stdlib")
HELD_OUT_BELOW = 26
EXCLUDED_RULE = ("pydoc_data/topics.py, and every encodings/*.py defining a module-level decoding_table or "
                 "decoding_map (the generated charmap codec tables)")


def excluded(path):
    """Whether a corpus file (its absolute path) is left out: EXCLUDED_RULE."""
    rel = os.path.relpath(path, ROOT)
    if rel == "pydoc_data/topics.py":
        return True
    if os.path.dirname(rel) == "encodings":
        with open(path, "rb") as f:
            text = f.read()
        return re.search(rb"^(decoding_table|decoding_map)\s*=", text, re.M) is not None
    return False


def package_versions():
    """{package: version} of the corpus's packages, as dpkg knows them."""
    out = {}
    for pkg in PACKAGES:
        out[pkg] = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], check=True, capture_output=True,
                                  text=True).stdout.strip()
    return out


def package_files():
    """Every *.py under ROOT owned by PACKAGES, sorted, that exists."""
    listed = subprocess.run(["dpkg-query", "-L", *PACKAGES], check=True, capture_output=True, text=True).stdout
    files = sorted({p for p in listed.splitlines()
                    if p.startswith(ROOT + "/") and p.endswith(".py") and os.path.isfile(p)})
    if not files:
        raise RuntimeError(f"corpus: dpkg lists no *.py files of {', '.join(PACKAGES)} under {ROOT}")
    return files


def source_files():
    """The corpus's files: package_files() less the excluded ones."""
    return [f for f in package_files() if not excluded(f)]


def held_out(path):
    """Whether a file (its absolute path) is in the held-out split."""
    rel = os.path.relpath(path, ROOT)
    return hashlib.sha256(rel.encode("utf-8")).digest()[0] < HELD_OUT_BELOW


def splits(max_files=None):
    """{"train": paths, "held_out": paths}: the corpus's files of each split, sorted; max_files
    keeps only the first files of each split (the smoke test's small corpus)."""
    files = source_files()
    out = {"train": [f for f in files if not held_out(f)], "held_out": [f for f in files if held_out(f)]}
    if max_files is not None:
        out = {k: v[:max_files] for k, v in out.items()}
    return out


def load(max_files=None):
    """(train, held, held_spans, info): the two splits as uint8 tensors, the (start, end) byte
    range of each held-out file in `held`, and what they are made of ({files, bytes, sha256} per
    split, the packages' versions, the excluded files). max_files: see splits()."""
    out, info = {}, {"root": ROOT, "packages": package_versions(), "held_out_rule":
                     f"sha256(path relative to {ROOT})[0] < {HELD_OUT_BELOW}",
                     "excluded_rule": EXCLUDED_RULE,
                     "excluded": [os.path.relpath(f, ROOT) for f in package_files() if excluded(f)]}
    spans = []
    for name, paths in splits(max_files).items():
        chunks, at = [], 0
        for p in paths:
            with open(p, "rb") as f:
                chunks.append(f.read())
            if name == "held_out":
                spans.append((at, at + len(chunks[-1])))
            at += len(chunks[-1]) + 2
            chunks.append(b"\n\n")
        data = b"".join(chunks)
        out[name] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        info[name] = {"files": len(paths), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return out["train"], out["held_out"], spans, info


def train_batch(data, gen, batch, context):
    """`batch` random windows of context + 1 bytes of `data` (offsets drawn from gen): (x, y),
    int64 [batch, context], y the next byte of each x."""
    starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=gen)
    rows = torch.stack([data[s:s + context + 1] for s in starts.tolist()]).long()
    return rows[:, :-1], rows[:, 1:]


def window_starts(spans, count, context):
    """Where `count` evaluation windows of context + 1 bytes start, stratified by file: the files
    (spans, (start, end) each) at least context + 1 bytes long share the windows equally (file f of
    F gets ((f + 1) count) // F - (f count) // F of them: count / F rounded down or up, and with
    fewer windows than files, one for every F / count-th file), spread evenly within each file.
    No randomness."""
    files = [(a, b) for a, b in spans if b - a >= context + 1]
    if not files:
        raise RuntimeError(f"corpus: no held-out file has {context + 1} bytes")
    n = len(files)
    starts = []
    for f, (a, b) in enumerate(files):
        m = (f + 1) * count // n - f * count // n
        span = b - a - context - 1
        starts += [a + j * span // max(m - 1, 1) for j in range(m)]
    return starts


def eval_windows(data, spans, count, context):
    """The evaluation windows (window_starts) of `data`: (x, y), int64 [count, context]."""
    rows = torch.stack([data[s:s + context + 1] for s in window_starts(spans, count, context)]).long()
    return rows[:, :-1], rows[:, 1:]
