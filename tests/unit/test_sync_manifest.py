"""What `--sync DIR` sends: git's list in a work tree, the .gitignore rules outside one."""

import hashlib
import os
import subprocess

import pytest

from console.launch import gitignore
from console.launch.sync import SyncError, build_manifest, walk_files


@pytest.fixture(autouse=True)
def plain_git(tmp_path_factory, monkeypatch):
    """git without the user's global config (a global excludes file would change the lists)."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(home.parent))


def write(root, rel, data="x\n", mode=None):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(data)
    if mode is not None:
        os.chmod(path, mode)
    return path


def git(root, *args):
    subprocess.run(["git", "-C", str(root), "-c", "user.email=t@example.com", "-c",
                    "user.name=t", *args], check=True, capture_output=True)


def paths(manifest):
    return [e.path for e in manifest.entries]


def test_git_tree_sends_tracked_and_untracked_not_ignored(tmp_path):
    root = tmp_path / "proj"
    write(root, ".gitignore", "*.log\ndata/\n")
    write(root, "train.py", "print('hi')\n")
    write(root, "run.sh", "#!/bin/sh\n", mode=0o755)
    write(root, "pkg/model.py")
    write(root, "gone.py")
    write(root, "forced.log", "tracked although ignored\n")
    git(root, "init", "-q")
    git(root, "add", ".gitignore", "train.py", "run.sh", "pkg/model.py", "gone.py")
    git(root, "add", "-f", "forced.log")
    git(root, "commit", "-q", "-m", "init")
    os.remove(root / "gone.py")                       # tracked, deleted from the work tree
    write(root, "new_untracked.py")                   # untracked, not ignored: sent
    write(root, "out.log")                            # ignored
    write(root, "data/big.bin")                       # in an ignored folder
    write(root, ".rankdeck/placed.json", "{}")        # rankdeck's own: never
    os.symlink("train.py", root / "link.py")          # symlinks: left out, with a warning

    m = build_manifest(str(root))

    assert m.source == "git"
    assert paths(m) == [".gitignore", "forced.log", "new_untracked.py", "pkg/model.py",
                        "run.sh", "train.py"]
    assert ("link.py", "symlink, not sent") in m.skipped
    by_path = {e.path: e for e in m.entries}
    assert by_path["run.sh"].mode == 0o755 and by_path["train.py"].mode == 0o644
    assert by_path["train.py"].sha256 == hashlib.sha256(b"print('hi')\n").hexdigest()
    assert by_path["train.py"].size == len("print('hi')\n")
    assert m.bytes == sum(e.size for e in m.entries)


def test_git_subfolder_lists_only_that_folder(tmp_path):
    root = tmp_path / "repo"
    write(root, "top.py")
    write(root, "proj/a.py")
    write(root, "proj/sub/b.py")
    git(root, "init", "-q")
    m = build_manifest(str(root / "proj"))
    assert m.source == "git"
    assert paths(m) == ["a.py", "sub/b.py"]


def test_tree_hash_follows_content_and_mode_not_mtime(tmp_path):
    root = tmp_path / "t"
    write(root, "a.py", "one\n")
    write(root, "b.py", "two\n")
    first = build_manifest(str(root)).tree
    os.utime(root / "a.py", (1, 1))
    assert build_manifest(str(root)).tree == first
    write(root, "a.py", "ONE\n")
    changed = build_manifest(str(root)).tree
    assert changed != first
    os.chmod(root / "b.py", 0o755)
    assert build_manifest(str(root)).tree not in (first, changed)


GITIGNORE = """\
# a comment, then a blank line

*.pyc
!keep.pyc
/build
logs/
docs/**/draft.md
cache/**
\\#literal
trailing\\ 
**/secret.txt
tmp?.txt
[ab]x.txt
"""
NESTED = "*.csv\n!wanted.csv\n/local_only\n"
FILES = [
    "main.py", "main.pyc", "keep.pyc", "sub/mod.pyc", "sub/keep.pyc",
    "build/out.o", "sub/build/kept.py", "logs/run.txt", "sub/logs",
    "docs/draft.md", "docs/a/b/draft.md", "docs/a/notes.md",
    "cache/x/y.bin", "cache_not/z.py",
    "#literal", "trailing ", "deep/er/secret.txt", "tmp1.txt", "tmp12.txt", "ax.txt", "cx.txt",
    "sub/table.csv", "sub/wanted.csv", "table.csv", "sub/local_only", "sub/deeper/local_only",
]


def test_gitignore_walk_matches_git_itself(tmp_path):
    """The same tree listed by our .gitignore rules and by git after `git init` agree."""
    root = tmp_path / "plain"
    write(root, ".gitignore", GITIGNORE)
    write(root, "sub/.gitignore", NESTED)
    for rel in FILES:
        write(root, rel)
    write(root, ".rankdeck/runs/r/journal")

    m = build_manifest(str(root))
    assert m.source == "gitignore"
    ours = paths(m)
    # spot checks, so that a shared mistake with git cannot pass unseen
    for rel in ("main.py", "keep.pyc", "sub/keep.pyc", "sub/build/kept.py", "sub/logs",
                "docs/a/notes.md", "cache_not/z.py", "tmp12.txt", "cx.txt", "sub/wanted.csv",
                "table.csv", "sub/deeper/local_only"):
        assert rel in ours, rel
    for rel in ("main.pyc", "sub/mod.pyc", "build/out.o", "logs/run.txt", "docs/draft.md",
                "docs/a/b/draft.md", "cache/x/y.bin", "#literal", "trailing ",
                "deep/er/secret.txt", "tmp1.txt", "ax.txt", "sub/table.csv", "sub/local_only"):
        assert rel not in ours, rel
    assert not any(p.startswith(".rankdeck/") for p in ours)

    git(root, "init", "-q")
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    by_git = sorted(p.decode() for p in listed.split(b"\0") if p)
    assert [p for p in by_git if not p.startswith(".rankdeck/")] == ours


def test_non_git_tree_never_sends_git_or_rankdeck_folders(tmp_path):
    root = tmp_path / "plain2"
    write(root, "a.py")
    write(root, ".rankdeck/placed.json", "{}")
    write(root, "sub/.git", "gitdir: elsewhere\n")  # a stray .git file lower down
    os.makedirs(root / ".git")  # not a repository: git says no work tree
    write(root, ".git/HEAD", "junk\n")
    skipped = []
    assert walk_files(str(root), skipped) == ["a.py"]
    m = build_manifest(str(root))
    assert paths(m) == ["a.py"]


def test_symlinked_folder_is_skipped_with_a_warning(tmp_path):
    root = tmp_path / "links"
    write(root, "real/a.py")
    os.symlink(str(tmp_path), root / "outside")
    m = build_manifest(str(root))
    assert paths(m) == ["real/a.py"]
    assert ("outside", "symlink, not sent") in m.skipped


def test_not_a_folder(tmp_path):
    with pytest.raises(SyncError, match="not a folder"):
        build_manifest(str(tmp_path / "nope"))


@pytest.mark.parametrize("pattern,path,is_dir,expected", [
    ("*.py", "a/b/c.py", False, True),
    ("/a.py", "sub/a.py", False, False),
    ("a/*.py", "a/b/c.py", False, False),      # `*` never crosses `/`
    ("a/**/c.py", "a/c.py", False, True),      # `/**/` is zero or more folders
    ("**/c.py", "x/y/c.py", False, True),
    ("out/", "out", False, False),             # a folder-only pattern skips a file
    ("[!a]x", "bx", False, True),
    ("[!a]x", "ax", False, False),
    ("[", "[", False, False),                  # unclosed class: matches nothing
])
def test_single_patterns(pattern, path, is_dir, expected):
    assert gitignore.ignored(gitignore.parse(pattern), path, is_dir) is expected


def test_hash_cache_is_trusted_only_while_the_stat_is_the_same(tmp_path, monkeypatch):
    from console.launch.sync import HashCache

    monkeypatch.setattr(HashCache, "RACY_SECONDS", -1.0)  # files here are seconds old
    root = tmp_path / "cached"
    write(root, "a.py", "aaaa\n")
    first = build_manifest(str(root))
    cache = HashCache(str(os.path.abspath(root)))
    assert set(cache.old) == {"a.py"}
    # a cache entry whose stat still matches is used as is (that is what saves the hashing)
    cache.old["a.py"][4] = "f" * 64
    with open(cache.path, "w") as f:
        f.write(__import__("json").dumps(cache.old))
    assert build_manifest(str(root)).entries[0].sha256 == "f" * 64
    # same size, new bytes: the stat differs (mtime/ctime), so the file is hashed again
    write(root, "a.py", "bbbb\n")
    assert build_manifest(str(root)).entries[0].sha256 == \
        hashlib.sha256(b"bbbb\n").hexdigest() != first.entries[0].sha256
    assert build_manifest(str(root), cache=False).entries[0].sha256 == \
        hashlib.sha256(b"bbbb\n").hexdigest()
