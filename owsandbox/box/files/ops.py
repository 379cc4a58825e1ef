"""File operations of the runner protocol (`fs.*` methods), run inside the sandbox.

The agent outside the sandbox reads, writes and searches files through these handlers instead of
through shell commands, so that results are exact (bytes, CRLF, hashes) and bounded in size whatever
the file. Every handler streams: a page of a huge file never loads the whole file into memory.
Writes are atomic and can be made conditional on the content hash read earlier, so an edit never
overwrites a change it has not seen. Standard library only: this module is copied into the sandbox.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fnmatch
import hashlib
import heapq
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from typing import Any, BinaryIO

from ...protocol import FS_ERROR, INVALID_PARAMS, RunnerError
from ...protocol import messages as M
from ...protocol.methods import FS_LIST, FS_MKDIR, FS_READ, FS_REMOVE, FS_SEARCH, FS_STAT, FS_WRITE
from ..params import Handler, at_least, handles

PAGE_CAP_BYTES = 1024 * 1024
DEFAULT_LIMIT_LINES = 2000
STAT_HASH_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_ENTRIES = 10000
DEFAULT_MAX_MATCHES = 1000
SEARCH_MAX_FILE_BYTES = 64 * 1024 * 1024
SEARCH_BINARY_PROBE_BYTES = 8 * 1024
SEARCH_TEXT_MAX_CHARS = 500

_CHUNK = 1024 * 1024
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


# ---------------------------------------------------------------- paths, params and errors


def resolve_path(path: str, base: str) -> str:
    """The absolute, normalised form of `path`; relative paths resolve against `base`, `~` expands.
    Symlinks are not resolved."""
    expanded = os.path.expanduser(path)
    return os.path.abspath(os.path.join(base, expanded))


def _path_param(value: str | None, base: str, default: str | None = None) -> str:
    """The param `path` (already a string, or absent: `default`), resolved against `base`."""
    value = default if value is None else value
    if not value:
        raise RunnerError(INVALID_PARAMS, "param 'path' must not be empty")
    if "\0" in value:
        raise RunnerError(INVALID_PARAMS, "param 'path' must not contain a NUL character")
    return resolve_path(value, base)


def _given(value: Any, default: Any) -> Any:
    """An optional param's value, `default` when it is absent (or null)."""
    return default if value is None else value


def _fs_error(path: str, message: str) -> RunnerError:
    return RunnerError(FS_ERROR, message, {"path": path})


def _describe(exc: OSError, path: str) -> str:
    messages = {
        errno.ENOENT: f"no such file: {path}",
        errno.EISDIR: f"'{path}' is a folder, not a file",
        errno.ENOTDIR: f"a parent of {path} is not a folder",
        errno.EACCES: f"permission denied: {path}",
        errno.EPERM: f"permission denied: {path}",
        errno.ENOTEMPTY: f"folder not empty: {path}",
        errno.EEXIST: f"{path} already exists",
        errno.ENOSPC: f"no space left on the device: {path}",
        errno.EROFS: f"read-only file system: {path}",
    }
    return messages.get(exc.errno or 0, f"{exc.strerror or exc}: {path}")


@contextlib.contextmanager
def _os_errors(path: str) -> Iterator[None]:
    """Turns any OSError raised inside into FS_ERROR naming `path`."""
    try:
        yield
    except OSError as exc:
        raise _fs_error(path, _describe(exc, path)) from exc


def _lstat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def _require_regular_file(path: str) -> os.stat_result:
    """The stat of the regular file at `path` (symlinks followed), or FS_ERROR saying what is there."""
    with _os_errors(path):
        info = os.stat(path)
    if stat.S_ISDIR(info.st_mode):
        raise _fs_error(path, f"'{path}' is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise _fs_error(path, f"'{path}' is not a regular file")
    return info


def _sha256_of_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- fs.read


@handles(FS_READ)
def fs_read(params: M.ReadParams, base: str) -> M.ReadLinesResult | M.ReadBytesResult:
    """A page of a file, by lines (text) or by bytes (base64), at most 1 MiB of data."""
    path = _path_param(params["path"], base)
    by_lines = params.get("offset_line") is not None or params.get("limit_lines") is not None
    by_bytes = params.get("offset_bytes") is not None or params.get("limit_bytes") is not None
    if by_lines and by_bytes:
        raise RunnerError(INVALID_PARAMS, "give either 'offset_line'/'limit_lines' or "
                                          "'offset_bytes'/'limit_bytes', not both")
    if by_bytes:
        offset = at_least("offset_bytes", _given(params.get("offset_bytes"), 0), 0)
        limit = at_least("limit_bytes", _given(params.get("limit_bytes"), PAGE_CAP_BYTES), 0)
        return _read_bytes(path, offset, limit)
    start_line = at_least("offset_line", _given(params.get("offset_line"), 1), 1)
    limit_lines = at_least("limit_lines", _given(params.get("limit_lines"), DEFAULT_LIMIT_LINES), 0)
    return _read_lines(path, start_line, limit_lines)


def _read_bytes(path: str, offset: int, limit: int) -> M.ReadBytesResult:
    _require_regular_file(path)
    with _os_errors(path), open(path, "rb") as handle:
        total = os.fstat(handle.fileno()).st_size
        handle.seek(offset)
        data = handle.read(min(limit, PAGE_CAP_BYTES))
    return M.ReadBytesResult(path=path, data_b64=base64.b64encode(data).decode("ascii"), offset_bytes=offset,
                             length=len(data), total_bytes=total, eof=offset + len(data) >= total)


def _read_lines(path: str, start_line: int, limit_lines: int) -> M.ReadLinesResult:
    _require_regular_file(path)
    with _os_errors(path), open(path, "rb") as handle:
        total = os.fstat(handle.fileno()).st_size
        skipped = _skip_lines(handle, start_line - 1)
        lines = _take_lines(handle, limit_lines, PAGE_CAP_BYTES)
        eof = handle.tell() >= total
        page = b"".join(lines)
        line_ends = skipped + page.count(b"\n") + _count_line_ends(handle)
        unterminated = total > 0 and os.pread(handle.fileno(), 1, total - 1) != b"\n"
    return M.ReadLinesResult(path=path, text=page.decode("utf-8", errors="replace"), start_line=start_line,
                             end_line=start_line + len(lines) - 1, total_lines=line_ends + int(unterminated),
                             total_bytes=total, eof=eof)


def _skip_lines(handle: BinaryIO, count: int) -> int:
    """Moves past `count` line ends, reading in chunks; returns how many it found."""
    found = 0
    while found < count:
        chunk = handle.read(_CHUNK)
        if not chunk:
            break
        need = count - found
        in_chunk = chunk.count(b"\n")
        if in_chunk < need:
            found += in_chunk
            continue
        rest = chunk.split(b"\n", need)[-1]
        handle.seek(-len(rest), os.SEEK_CUR)
        found = count
    return found


def _take_lines(handle: BinaryIO, limit: int, cap: int) -> list[bytes]:
    """Up to `limit` whole lines totalling at most `cap` bytes; a first line longer than `cap` is cut
    at `cap`. The handle is left just after the last byte returned."""
    lines: list[bytes] = []
    used = 0
    while len(lines) < limit:
        room = cap - used
        line = handle.readline(room + 1)
        if not line:
            break
        if len(line) <= room:
            lines.append(line)
            used += len(line)
            continue
        if lines:
            handle.seek(-len(line), os.SEEK_CUR)
        else:
            lines.append(line[:cap])
            handle.seek(cap - len(line), os.SEEK_CUR)
        break
    return lines


def _count_line_ends(handle: BinaryIO) -> int:
    count = 0
    while chunk := handle.read(_CHUNK):
        count += chunk.count(b"\n")
    return count


# ---------------------------------------------------------------- fs.write


@handles(FS_WRITE)
def fs_write(params: M.WriteParams, base: str) -> M.WriteResult:
    """Writes (or appends to) a file atomically, optionally only if its content is still the one read."""
    path = _path_param(params["path"], base)
    data = _content_param(params.get("text"), params.get("data_b64"))
    expected = _precondition_param(params.get("if_match_sha256"))
    append = _given(params.get("append"), False)
    make_parents = _given(params.get("make_parents"), False)
    target = os.path.realpath(path)  # write through a symlink, never replace the link itself
    current = _existing_file(target, path)
    _prepare_parent(os.path.dirname(target), make_parents)
    if expected is not None and not append:
        # only its existence matters for the "" precondition: no need to hash the file then
        found = None if current is None else ("exists" if expected == "" else _hashed(target, path))
        _check_precondition(path, expected, found)
    digest, size = _replace_atomically(target, path, data, current, expected, append)
    return M.WriteResult(path=path, bytes_written=len(data), sha256=digest, size=size)


def _content_param(text: str | None, data_b64: str | None) -> bytes:
    if (text is None) == (data_b64 is None):
        raise RunnerError(INVALID_PARAMS, "give exactly one of param 'text' or param 'data_b64'")
    if text is not None:
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RunnerError(INVALID_PARAMS, f"param 'text' is not valid Unicode: {exc}") from exc
    try:
        return base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RunnerError(INVALID_PARAMS, f"param 'data_b64' is not valid base64: {exc}") from exc


def _precondition_param(expected: str | None) -> str | None:
    if expected is None or expected == "":
        return expected
    if not _SHA256_HEX.fullmatch(expected):
        raise RunnerError(INVALID_PARAMS, "param 'if_match_sha256' must be a sha256 hex digest "
                                          "(64 hex digits) or an empty string")
    return expected.lower()


def _existing_file(target: str, path: str) -> os.stat_result | None:
    """The stat of the file about to be replaced, None if there is none; FS_ERROR if it is not a file."""
    try:
        info = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise _fs_error(path, _describe(exc, path)) from exc
    if stat.S_ISDIR(info.st_mode):
        raise _fs_error(path, f"'{path}' is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise _fs_error(path, f"'{path}' is not a regular file")
    return info


def _prepare_parent(parent: str, make_parents: bool) -> None:
    if os.path.isdir(parent):
        return
    if os.path.lexists(parent):
        raise _fs_error(parent, f"not a folder: {parent}")
    if not make_parents:
        raise _fs_error(parent, f"no such folder: {parent} (set make_parents to create it)")
    with _os_errors(parent):
        os.makedirs(parent, exist_ok=True)


def _hashed(target: str, path: str) -> str:
    with _os_errors(path):
        return _sha256_of_file(target)


def _check_precondition(path: str, expected: str, found: str | None) -> None:
    """Raises FS_ERROR unless the current content (sha256 `found`, None: no file) is the expected one."""
    if expected == "":
        if found is not None:
            raise _fs_error(path, f"{path} already exists")
        return
    if found != expected:
        seen = "no file" if found is None else found
        raise _fs_error(path, f"the file changed since it was read: {path} "
                              f"(expected sha256 {expected}, found {seen})")


def _replace_atomically(target: str, path: str, data: bytes, current: os.stat_result | None,
                        expected: str | None, append: bool) -> tuple[str, int]:
    """Writes a temp file next to `target` and moves it into place; returns (sha256, size) of the new
    content. For an append the old content is copied first and checked against `expected` in the same
    read; `expected == ""` makes the final move fail if a file appeared meanwhile."""
    temp = _create_temp(target, path, current)
    try:
        digest = hashlib.sha256()
        size = 0
        with _os_errors(path), open(temp, "wb") as out:
            if append and current is not None:
                size += _copy_hashing(target, out, digest)
            if append and expected is not None:
                _check_precondition(path, expected, None if current is None else digest.hexdigest())
            out.write(data)
            digest.update(data)
            size += len(data)
            out.flush()
            os.fsync(out.fileno())
        _commit(temp, target, path, exclusive=expected == "")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_folder(os.path.dirname(target))
    return digest.hexdigest(), size


def _create_temp(target: str, path: str, current: os.stat_result | None) -> str:
    folder, name = os.path.split(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    with _os_errors(path):
        while True:
            temp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
            try:
                fd = os.open(temp, flags, 0o666)  # a new file gets the usual umask-based mode
            except FileExistsError:
                continue
            try:
                if current is not None:
                    os.fchmod(fd, stat.S_IMODE(current.st_mode))
            finally:
                os.close(fd)
            return temp


def _copy_hashing(source: str, out: BinaryIO, digest: Any) -> int:
    copied = 0
    with open(source, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            out.write(chunk)
            digest.update(chunk)
            copied += len(chunk)
    return copied


def _commit(temp: str, target: str, path: str, exclusive: bool) -> None:
    """Moves the temp file into place; with `exclusive`, fails if a file appeared there meanwhile."""
    with _os_errors(path):
        if not exclusive:
            os.replace(temp, target)
            return
        try:
            os.link(temp, target)  # atomic create-if-absent
        except FileExistsError as exc:
            raise _fs_error(path, f"{path} already exists") from exc
        except OSError:  # a file system without hard links: check, then replace
            if os.path.lexists(target):
                raise _fs_error(path, f"{path} already exists") from None
            os.replace(temp, target)
            return
        os.unlink(temp)


def _fsync_folder(folder: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------- fs.stat, fs.list


@handles(FS_STAT)
def fs_stat(params: M.StatParams, base: str) -> M.StatResult:
    """What is at `path` (symlinks not followed); a missing path is `exists: false`, not an error."""
    path = _path_param(params["path"], base)
    with _os_errors(path):
        info = _lstat_or_none(path)
    if info is None:
        return M.StatResult(path=path, exists=False, type=None, size=None, mode=None, mtime=None, sha256=None)
    return M.StatResult(path=path, exists=True, type=_kind(info.st_mode), size=info.st_size,
                        mode=f"{stat.S_IMODE(info.st_mode):04o}", mtime=info.st_mtime,
                        sha256=_stat_hash(path, info))


def _stat_hash(path: str, info: os.stat_result) -> str | None:
    if not stat.S_ISREG(info.st_mode) or info.st_size > STAT_HASH_MAX_BYTES:
        return None
    try:
        return _sha256_of_file(path)
    except OSError:  # unreadable: the stat itself still answers
        return None


@handles(FS_LIST)
def fs_list(params: M.ListParams, base: str) -> M.ListResult:
    """The entries of a folder sorted by name, at most `max_entries` of them."""
    path = _path_param(params.get("path"), base, default=".")
    max_entries = at_least("max_entries", _given(params.get("max_entries"), DEFAULT_MAX_ENTRIES), 0)
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise _fs_error(path, f"no such folder: {path}") from exc
    except OSError as exc:
        raise _fs_error(path, _describe(exc, path)) from exc
    if not stat.S_ISDIR(info.st_mode):
        raise _fs_error(path, f"'{path}' is a file, not a folder")
    with _os_errors(path), os.scandir(path) as scan:
        first = heapq.nsmallest(max_entries + 1, scan, key=lambda entry: entry.name)
    entries = [described for entry in first[:max_entries] if (described := _describe_entry(entry))]
    return M.ListResult(path=path, entries=entries, truncated=len(first) > max_entries)


def _describe_entry(entry: os.DirEntry[str]) -> M.ListEntry | None:
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:  # vanished since the folder was read
        return None
    return M.ListEntry(name=entry.name, type=_kind(info.st_mode), size=info.st_size, mtime=info.st_mtime)


# ---------------------------------------------------------------- fs.search


@handles(FS_SEARCH)
def fs_search(params: M.SearchParams, base: str) -> M.SearchResult:
    """Lines matching a regex in the text files under `path` (or in the one file `path`)."""
    root = _path_param(params.get("path"), base, default=".")
    regex = _regex_param(params["pattern"], _given(params.get("ignore_case"), False))
    max_matches = at_least("max_matches", _given(params.get("max_matches"), DEFAULT_MAX_MATCHES), 1)
    name_glob = params.get("glob")
    with _os_errors(root):
        info = os.stat(root)
    files = _walk_files(root, name_glob) if stat.S_ISDIR(info.st_mode) else iter([root])
    matches: list[M.SearchMatch] = []
    searched = 0
    for file_path in files:
        if not _searchable(file_path):
            continue
        searched += 1
        if not _search_file(file_path, regex, matches, max_matches + 1):
            break
    truncated = len(matches) > max_matches
    return M.SearchResult(matches=matches[:max_matches], truncated=truncated, files_searched=searched)


def _regex_param(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    flags = re.IGNORECASE if ignore_case else 0
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise RunnerError(INVALID_PARAMS, f"param 'pattern' is not a valid regular expression: "
                                          f"{pattern!r}: {exc}") from exc


def _walk_files(root: str, name_glob: str | None) -> Iterator[str]:
    """File paths under `root`, depth first with every folder's entries sorted by name (so `a/x` comes
    before `b`); skips `.git` folders and does not follow symlinked folders. Unreadable folders are
    skipped."""
    stack = [iter(_sorted_entries(root))]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
        elif entry.is_dir(follow_symlinks=False):
            if entry.name != ".git":
                stack.append(iter(_sorted_entries(entry.path)))
        elif name_glob is None or fnmatch.fnmatch(entry.name, name_glob):
            yield entry.path


def _sorted_entries(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as scan:
            return sorted(scan, key=lambda entry: entry.name)
    except OSError:
        return []


def _searchable(path: str) -> bool:
    """A regular file of at most 64 MiB, readable, without a NUL byte in its first 8 KiB."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > SEARCH_MAX_FILE_BYTES:
            return False
        with open(path, "rb") as handle:
            return b"\0" not in handle.read(SEARCH_BINARY_PROBE_BYTES)
    except OSError:
        return False


def _search_file(path: str, regex: re.Pattern[str], matches: list[M.SearchMatch], stop_at: int) -> bool:
    """Appends the matching lines of one file; False once `stop_at` matches are collected."""
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                text = raw.rstrip(b"\n").removesuffix(b"\r").decode("utf-8", errors="replace")
                if regex.search(text):
                    matches.append(M.SearchMatch(path=path, line=number, text=text[:SEARCH_TEXT_MAX_CHARS]))
                    if len(matches) >= stop_at:
                        return False
    except OSError:
        pass  # vanished or became unreadable while searching: keep what was found
    return True


# ---------------------------------------------------------------- fs.mkdir, fs.remove


@handles(FS_MKDIR)
def fs_mkdir(params: M.MkdirParams, base: str) -> M.MkdirResult:
    """Creates a folder (with its parents by default); an existing folder is `created: false`."""
    path = _path_param(params["path"], base)
    parents = _given(params.get("parents"), True)
    if os.path.isdir(path):
        return M.MkdirResult(path=path, created=False)
    if os.path.lexists(path):
        raise _fs_error(path, f"'{path}' exists and is not a folder")
    parent = os.path.dirname(path)
    if not parents and not os.path.isdir(parent):
        raise _fs_error(path, f"no such folder: {parent} (set parents to create it)")
    try:
        with _os_errors(path):
            if parents:
                os.makedirs(path)
            else:
                os.mkdir(path)
    except RunnerError:
        if os.path.isdir(path):  # made by someone else meanwhile
            return M.MkdirResult(path=path, created=False)
        raise
    return M.MkdirResult(path=path, created=True)


@handles(FS_REMOVE)
def fs_remove(params: M.RemoveParams, base: str) -> M.RemoveResult:
    """Removes a file, symlink (never its target) or folder; a missing path is `removed: false`."""
    path = _path_param(params["path"], base)
    recursive = _given(params.get("recursive"), False)
    with _os_errors(path):
        info = _lstat_or_none(path)
    if info is None:
        return M.RemoveResult(path=path, removed=False)
    if not stat.S_ISDIR(info.st_mode):
        with _os_errors(path):
            os.unlink(path)
    elif recursive:
        _remove_tree(path)
    else:
        _remove_empty_folder(path)
    return M.RemoveResult(path=path, removed=True)


def _remove_empty_folder(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise _fs_error(path, f"folder not empty: {path} (set recursive to remove it with "
                                  f"its contents)") from exc
        raise _fs_error(path, _describe(exc, path)) from exc


def _remove_tree(path: str) -> None:
    try:
        shutil.rmtree(path)
    except OSError as exc:
        failed = exc.filename if isinstance(exc.filename, str) else path
        raise _fs_error(path, _describe(exc, failed)) from exc


HANDLERS: dict[str, Handler] = {
    FS_READ: fs_read,
    FS_WRITE: fs_write,
    FS_STAT: fs_stat,
    FS_LIST: fs_list,
    FS_SEARCH: fs_search,
    FS_MKDIR: fs_mkdir,
    FS_REMOVE: fs_remove,
}
