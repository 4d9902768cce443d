"""The experiment's text: the Python standard library sources that Debian 12 ships
(libpython3.11-minimal and libpython3.11-stdlib, which every Debian 12 with python3 has:
python3 -> python3.11 -> libpython3.11-stdlib -> libpython3.11-minimal; scripts/install-deps.sh
installs python3). Nobody here wrote them.

The file list comes from dpkg (`dpkg-query -L`), not from a glob of /usr/lib/python3.11, so files
that other packages drop there (python3-distutils, python3-lib2to3, a venv package, ...) do not
change the corpus. Every `*.py` file the two packages own under /usr/lib/python3.11 is used,
sorted by path.

Held-out split by file: a file is held out when the first byte of SHA-256 of its path relative to
/usr/lib/python3.11 is below HELD_OUT_BELOW (26/256: about 10% of the files). The split depends on
nothing but the path.

Each split is the files' bytes one after the other (sorted by path), each followed by a blank
line, as one uint8 tensor: the model reads bytes (a vocabulary of 256)."""

import hashlib
import os
import subprocess

import torch

ROOT = "/usr/lib/python3.11"
PACKAGES = ("libpython3.11-minimal", "libpython3.11-stdlib")
HELD_OUT_BELOW = 26


def package_versions():
    """{package: version} of the corpus's packages, as dpkg knows them."""
    out = {}
    for pkg in PACKAGES:
        out[pkg] = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], check=True, capture_output=True,
                                  text=True).stdout.strip()
    return out


def source_files():
    """The corpus's files: every *.py under ROOT owned by PACKAGES, sorted, that exists."""
    listed = subprocess.run(["dpkg-query", "-L", *PACKAGES], check=True, capture_output=True, text=True).stdout
    files = sorted({p for p in listed.splitlines()
                    if p.startswith(ROOT + "/") and p.endswith(".py") and os.path.isfile(p)})
    if not files:
        raise RuntimeError(f"corpus: dpkg lists no *.py files of {', '.join(PACKAGES)} under {ROOT}")
    return files


def held_out(path):
    """Whether a file (its absolute path) is in the held-out split."""
    rel = os.path.relpath(path, ROOT)
    return hashlib.sha256(rel.encode("utf-8")).digest()[0] < HELD_OUT_BELOW


def load(max_files=None):
    """(train, held, info): the two splits as uint8 tensors and what they are made of ({files,
    bytes, sha256} per split, the packages' versions). max_files keeps only the first files of
    each split (the smoke test's small corpus)."""
    files = source_files()
    splits = {"train": [f for f in files if not held_out(f)], "held_out": [f for f in files if held_out(f)]}
    out, info = {}, {"root": ROOT, "packages": package_versions(), "held_out_rule":
                     f"sha256(path relative to {ROOT})[0] < {HELD_OUT_BELOW}"}
    for name, paths in splits.items():
        if max_files is not None:
            paths = paths[:max_files]
        chunks = []
        for p in paths:
            with open(p, "rb") as f:
                chunks.append(f.read())
            chunks.append(b"\n\n")
        data = b"".join(chunks)
        out[name] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        info[name] = {"files": len(paths), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return out["train"], out["held_out"], info


def train_batch(data, gen, batch, context):
    """`batch` random windows of context + 1 bytes of `data` (offsets drawn from gen): (x, y),
    int64 [batch, context], y the next byte of each x."""
    starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=gen)
    rows = torch.stack([data[s:s + context + 1] for s in starts.tolist()]).long()
    return rows[:, :-1], rows[:, 1:]


def eval_windows(data, count, context):
    """`count` windows of context + 1 bytes spread evenly over `data` (no randomness): (x, y)."""
    span = data.numel() - context - 1
    starts = [i * span // max(count - 1, 1) for i in range(count)]
    rows = torch.stack([data[s:s + context + 1] for s in starts]).long()
    return rows[:, :-1], rows[:, 1:]
