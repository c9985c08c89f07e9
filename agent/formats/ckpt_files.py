"""What a checkpoint on disk looks like right now: its files, their sizes, what is missing.

A save is complete when every file it should have is there, each file that says how long it
should be is that long, and nothing grew between two looks (agent/formats/ckpt_watch.py makes
the two looks). What "should have" means, by what is on disk:

- a Hugging Face Trainer folder (``checkpoint-N/``, transformers' ``Trainer._save_checkpoint``):
  weights (``model.safetensors``, ``pytorch_model.bin``, a PEFT adapter, or an ``*.index.json``
  and every shard its ``weight_map`` names) and ``trainer_state.json``, which the Trainer
  writes after the weights, optimizer, scheduler and RNG state;
- any folder: every name the run's previous complete folder checkpoint had (``optimizer.pt``,
  ``scheduler.pt``, ``rng_state_3.pth``...), so a save cut short of its optimizer shows so;
- ``torch.save`` files (a zip archive since torch 1.6) end with the zip's end-of-central-
  directory record; a ``.safetensors`` file is exactly 8 + header + the data its header names;
  a ``.json`` file (``config.json``, ``trainer_state.json``) parses.

Only file tails, safetensors headers and JSON files under 16 MiB are read. Standard library only; Python >= 3.8.
"""

import json
import os
import re
import struct

MAX_FILES = 4096  # files looked at in one folder checkpoint
JSON_READ = 16 << 20  # larger .json files are judged by growth alone
_HF_DIR = re.compile(r"^checkpoint-[0-9]+$")
_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"
_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors",
            "adapter_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class Snapshot:
    """One look at a checkpoint: ``files`` {relative name: (size, mtime_ns)}, ``missing``
    names, ``broken`` names (cut short), ``exists``."""

    __slots__ = ("exists", "is_dir", "files", "missing", "broken")

    def __init__(self, exists, is_dir=False, files=None, missing=(), broken=()):
        self.exists = exists
        self.is_dir = is_dir
        self.files = files or {}
        self.missing = sorted(missing)
        self.broken = sorted(broken)

    @property
    def bytes(self):
        return sum(size for size, _ in self.files.values())

    @property
    def newest_mtime(self):
        return max((m for _, m in self.files.values()), default=0) / 1e9

    def whole(self):
        """Nothing missing or cut short (growth is judged by comparing two snapshots)."""
        return self.exists and not self.missing and not self.broken


def look(path, expected=()):
    """A :class:`Snapshot` of the file or folder at ``path``; ``expected`` are names a folder
    must hold besides those its own format asks for."""
    try:
        st = os.stat(path)
    except OSError:
        return Snapshot(False, missing=[os.path.basename(path)])
    if not os.path.isdir(path):
        files = {os.path.basename(path): (st.st_size, st.st_mtime_ns)}
        broken = [] if file_whole(path, st.st_size) else [os.path.basename(path)]
        return Snapshot(True, files=files, broken=broken)
    files = _folder_files(path)
    missing = set(n for n in expected if n not in files)
    missing.update(_format_missing(path, files))
    broken = [n for n in files if not file_whole(os.path.join(path, n), files[n][0])]
    return Snapshot(True, True, files, missing, broken)


def _folder_files(path):
    files = {}
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:  # removed between listing and stat: the next look sees it
                continue
            files[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
            if len(files) >= MAX_FILES:
                return files
    return files


def _format_missing(path, files):
    """Names a Hugging Face style folder lacks: its weights, its shards, its trainer state."""
    hf_dir = _HF_DIR.match(os.path.basename(os.path.normpath(path))) is not None
    if not hf_dir and "config.json" not in files and "trainer_state.json" not in files:
        return []
    missing = []
    index = next((n for n in _INDEXES if n in files), None)
    if index is not None:
        missing.extend(s for s in _shards(os.path.join(path, index)) if s not in files)
    elif not any(w in files for w in _WEIGHTS):
        missing.append("model.safetensors")
    if hf_dir and "trainer_state.json" not in files:
        missing.append("trainer_state.json")
    return missing


def _shards(index_path):
    """The shard files an ``*.index.json`` names; unreadable (still being written): the
    index itself, so the save is not complete yet."""
    try:
        with open(index_path, "rb") as f:
            weight_map = json.loads(f.read(JSON_READ).decode("utf-8"))["weight_map"]
        return sorted(set(str(v) for v in weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [os.path.basename(index_path) + " (unreadable)"]


def file_whole(path, size):
    """False when the file says it is longer than it is (a zip archive without its end
    record, a safetensors file shorter than its header says); True when it cannot say."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if path.endswith(".safetensors"):
                return _safetensors_whole(f, head, size)
            if path.endswith(".json") and size <= JSON_READ:
                return _parses(head + f.read())
            if head[:4] == _ZIP_LOCAL:
                start = max(0, size - (64 << 10) - 22)
                f.seek(start)
                return _zip_ends(f.read(), size - start)
    except OSError:
        return False
    return True


def _zip_ends(tail, length):
    """The zip end record is the last thing in the file: 22 bytes and its comment."""
    at = tail.rfind(_ZIP_END)
    if at < 0 or at + 22 > length:
        return False
    (comment,) = struct.unpack("<H", tail[at + 20:at + 22])
    return at + 22 + comment == length


def _parses(data):
    try:
        json.loads(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError too
        return False
    return True


def _safetensors_whole(f, head, size):
    if len(head) < 8:
        return False
    (header_len,) = struct.unpack("<Q", head)
    if header_len > min(size, 100 << 20):
        return False
    try:
        header = json.loads(f.read(header_len).decode("utf-8"))
        end = max([0] + [int(t["data_offsets"][1]) for k, t in header.items()
                         if k != "__metadata__"])
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False
    return size == 8 + header_len + end
