"""The cross-process VRAM arena: Hotseat processes on one machine take turns on the GPU.

    arena = Arena()                      # $HOTSEAT_ARENA, else <user runtime dir>/hotseat/arena
    eng = Engine(arena=arena)            # the engine takes the token before any upload
    ...
    eng.close(); arena.close()

The arena is a private directory (mode 0700, owned by this user) holding three files (0600):

- `token.lock`: its `flock(LOCK_EX)` is the VRAM token. A process holds device memory for
  models only while it holds the token. The kernel drops the lock when its holder dies, so a
  process killed with SIGKILL frees it.
- `doorbell`: a process that needs the GPU appends one JSON line, at most `MAX_LINE` bytes:

      {"pid": 1234, "reason": "generate smollm2", "t": 1767000000.0}
      {"pid": 1250, "reason": "yield", "t": 1767000000.0, "until": 1767000060.0}

      {"pid": 1234, "event": "free", "t": 1767000000.0}
      {"pid": 1250, "event": "cancel", "t": 1767000000.0}

  `pid` (an int) is required; `reason` (a short string), `t` and `until` (wall-clock seconds)
  and `event` ("free" or "cancel") are optional. A line with `until` is a yield: no process
  acquires the token before that time (the latest yield counts; an `until` more than
  `MAX_YIELD_S` ahead is cut to it). `"event": "cancel"` ends a yield early and `"event":
  "free"` says that the token was just dropped (a process that wakes on a free token looks
  at once instead of at its next poll); neither is a ring. Lines that are not such objects
  (garbage bytes, overlong lines, other JSON) are skipped. Every process watches the
  doorbell with watchdog (inotify); the holder answers a ring through the callback given to
  `attach`: an Engine's, at its next safe point (between requests, prefill chunks or
  decoded tokens), evicts every model fully and then drops the lock.
- `holder`: `{"pid", "t", "reason"}` of the current holder, for diagnostics only (the lock
  decides; a holder that was killed leaves its line behind).
- `pool.json` and `members/<pid>.<tag>.sock`: the shared VRAM pool's manifest and each
  member's fd service (engine/residency/pool.py).
- `members/<pid>.json`: one file per process in the arena, `{"pid", "label", "waiting"}`,
  each locked (flock) by its process while it lives, so `hotseat ps` lists them and a file
  nobody locks is left over from a dead process and removed.

A waiter takes the lock with a blocking `flock` in a thread, re-ringing every
`ring_interval` seconds until it has the lock or its timeout passes; a reader that misses a
ring (the doorbell is cut back past `COMPACT_BYTES`, keeping a yield in force) gets the
next one. `hotseat yield --for SECONDS` rings a yield and waits for the token to be free,
so every Hotseat process goes cold and stays cold until then. Anyone able to write
the doorbell or open the lock file is this user: the directory and file modes keep other
users out, and a file that is a symbolic link, not a regular file or owned by someone else
is refused with `ArenaError`.

Why this module is long: the arena is a file protocol (the token lock, the doorbell, the
holder and member files), and every reader and writer of those files, with the checks that
keep them safe, sits in this one place.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import stat
import threading
import time
import warnings
from typing import Callable

from .arbiter import BudgetError

log = logging.getLogger(__name__)

LOCK_FILE, DOORBELL_FILE, HOLDER_FILE = "token.lock", "doorbell", "holder"
MEMBERS_DIR = "members"
EVENTS = ("free", "cancel")      # doorbell lines that are notices, not rings
MAX_LINE = 4096                  # bytes in one doorbell line; longer lines are skipped
MAX_YIELD_S = 24 * 3600          # the longest yield honoured
COMPACT_BYTES = 64 << 10         # a doorbell past this is cut back when someone rings
MAX_BACKLOG = 1 << 20            # unread doorbell bytes past this: only the tail is read
POLL_S = 1.0                     # the watcher also polls, in case an inotify event is lost


class ArenaError(RuntimeError):
    """The arena directory or one of its files is unsafe or unusable."""
    code = "arena"


class ArenaBusy(BudgetError):
    """The token did not come within the timeout (another process is busy, or a yield).
    `retry_after`: seconds until a yield in force ends, else None."""
    code = "arena_busy"

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def default_dir() -> str:
    if os.environ.get("HOTSEAT_ARENA"):
        return os.path.abspath(os.environ["HOTSEAT_ARENA"])
    import platformdirs

    with warnings.catch_warnings():        # the /tmp fallback warns; the checks below cover it
        warnings.simplefilter("ignore")
        runtime = platformdirs.user_runtime_dir("hotseat")
    return os.path.join(runtime, "arena")


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def prepare_dir(path: str) -> str:
    """Create the arena directory (0700) if needed; refuse one that others could reach."""
    uid = os.geteuid()
    parent = os.path.dirname(path.rstrip("/")) or "/"
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)                # whatever the umask
    except FileExistsError:
        pass
    except OSError as exc:
        raise ArenaError(f"cannot create the arena directory {path}: {exc.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ArenaError(f"arena directory {path} is a symbolic link; refusing it")
    if not stat.S_ISDIR(st.st_mode):
        raise ArenaError(f"arena path {path} is not a directory")
    if st.st_uid != uid:
        raise ArenaError(f"arena directory {path} is owned by uid {st.st_uid}, not by this "
                         f"user (uid {uid}); refusing it")
    if stat.S_IMODE(st.st_mode) != 0o700:
        raise ArenaError(f"arena directory {path} has mode {_mode(st)}; it must be private "
                         f"to this user (mode 0700): chmod 700 {path}")
    up = os.path.realpath(parent)
    while True:                    # nobody else may rename a directory on the way down
        pst = os.stat(up)
        others_write = pst.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if pst.st_uid not in (uid, 0) or (others_write and not pst.st_mode & stat.S_ISVTX):
            raise ArenaError(f"{up} (uid {pst.st_uid}, mode {_mode(pst)}) lets other users "
                             f"replace the arena directory {path}; refusing it")
        if up == os.path.dirname(up):
            return path
        up = os.path.dirname(up)


def open_private(path: str, flags: int) -> int:
    """Open (creating, 0600) a file of the arena; refuse links and files not ours alone."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ArenaError(f"{path} is a symbolic link; refusing it (remove it)") from None
        raise ArenaError(f"cannot open {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif stat.S_IMODE(st.st_mode) & 0o077:
        problem = f"has mode {_mode(st)}; it must be 0600"
    elif st.st_nlink != 1:
        problem = f"has {st.st_nlink} hard links"
    if problem:
        os.close(fd)
        raise ArenaError(f"{path} {problem}; refusing it")
    return fd


def parse_line(line: bytes) -> dict | None:
    """One doorbell line as {"pid", "reason", "until", "event", "t"}, or None when it is
    malformed."""
    if len(line) > MAX_LINE:
        return None
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    pid, reason, until = obj.get("pid"), obj.get("reason", ""), obj.get("until")
    if type(pid) is not int or not 0 < pid < 1 << 31:
        return None
    if not isinstance(reason, str) or len(reason) > 200:
        return None
    for v in (until, obj.get("t")):
        if v is not None and (type(v) not in (int, float) or not math.isfinite(v)):
            return None
    event = obj.get("event")
    if event is not None and (event not in EVENTS or until is not None):
        return None
    return {"pid": pid, "reason": reason, "until": None if until is None else float(until),
            "event": event, "t": obj.get("t")}


class _LockWaiter:
    """A blocking flock on its own descriptor, in a daemon thread. A flock cannot be
    cancelled, so a waiter given up on unlocks and closes its descriptor if the lock still
    comes."""

    def __init__(self, fd: int):
        self.fd = fd
        self.done = threading.Event()
        self.error: OSError | None = None
        self._abandoned = False
        self._mutex = threading.Lock()
        threading.Thread(target=self._run, name="hotseat-arena-flock", daemon=True).start()

    def _run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:
            self.error = exc
        with self._mutex:
            if self._abandoned or self.error is not None:
                os.close(self.fd)
            self.done.set()

    def take(self) -> int:
        if self.error is not None:
            raise ArenaError(f"cannot lock the arena token: {self.error.strerror}")
        return self.fd

    def abandon(self) -> int | None:
        """Give up waiting; the descriptor if the lock came after all, else None."""
        with self._mutex:
            if self.done.is_set():
                return self.take()
            self._abandoned = True
            return None


def _unlock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _quiet_stop(record: logging.LogRecord) -> bool:
    # watchdog logs an error when its emitter thread reads once more while being stopped
    return "called when the thread is inactive" not in record.getMessage()


class Arena:
    """One process's view of the arena. `on_event(event, info)` is told of "acquired"
    (after the lock is taken), "released" (before it is dropped), "waiting" and "rung" (a
    valid ring from another process), for diagnostics and ledgers; it runs on the arena's
    callers' threads, the first two under the arena's own lock, so it must neither call
    back into the arena nor wait for an engine's lock. `acquisitions` counts the times this
    process took the token."""

    def __init__(self, path: str | None = None, *, ring_interval: float = 0.5,
                 timeout: float | None = None, watch: bool = True,
                 on_event: Callable[[str, dict], None] | None = None):
        self.dir = prepare_dir(os.path.abspath(path) if path else default_dir())
        self.lock_path = os.path.join(self.dir, LOCK_FILE)
        self.doorbell_path = os.path.join(self.dir, DOORBELL_FILE)
        self.holder_path = os.path.join(self.dir, HOLDER_FILE)
        self.ring_interval = ring_interval
        self.timeout = timeout
        self.on_event = on_event
        self.pid = os.getpid()
        os.close(open_private(self.lock_path, os.O_RDWR))      # checked now, opened per wait
        os.close(open_private(self.holder_path, os.O_RDWR))
        self._observer = self._worker = None
        self._closed = False
        self._bell = open_private(self.doorbell_path, os.O_RDWR | os.O_APPEND)
        self._fd: int | None = None          # the locked token descriptor while held
        self._mutex = threading.Lock()       # acquire / release
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._cond = threading.Condition()   # yield changes
        self._offset, self._partial, self._skip = 0, b"", False
        self.yield_until, self.yield_by = 0.0, None
        self.yield_ended = 0.0               # when the last yield ended (or was cancelled)
        self._yield_line = b""
        self._rung_at = self._handled = self._acquired_at = -math.inf
        self._on_ring: Callable[[], None] | None = None
        self._on_free: Callable[[], None] | None = None
        self._wake = threading.Event()
        self.acquisitions = 0
        self._member_fd = -1
        self._member: dict = {}
        try:
            self._scan_tail()
            if watch:
                self._start_watching()
        except BaseException:
            self.close()
            raise

    # -- the token ------------------------------------------------------------------------
    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, reason: str = "", timeout: float | None = None,
                respect_yield: bool = True) -> None:
        """Take the token, ringing the holder out; waits out any yield first. Raises
        ArenaBusy after timeout seconds (default: the arena's; None waits for good)."""
        if self._fd is not None:
            return
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._mutex:
            if self._fd is not None:
                return
            while True:
                if respect_yield:
                    self._sit_out_yield(deadline)
                fd = self._lock_or_wait({"reason": reason}, deadline, respect_yield)
                if fd is None:
                    continue                           # a yield began while we waited
                self._poll()                           # the line that freed the token
                if respect_yield and self.yield_until > time.time():
                    _unlock(fd)
                    continue
                self._took(fd, reason)
                return

    def try_acquire(self, reason: str = "") -> bool:
        """Take the token only if it is free now and no yield is in force; never rings (so
        nobody is asked to leave). Whether this process holds it now."""
        if self._fd is not None:
            return True
        with self._mutex:
            if self._fd is not None:
                return True
            self._poll()
            if self.yield_until > time.time():
                return False
            fd = open_private(self.lock_path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            self._took(fd, reason)
            return True

    def _took(self, fd: int, reason: str) -> None:
        self._fd = fd
        self._acquired_at = time.monotonic()
        self.acquisitions += 1
        self._wake.set()                       # rings just before count: one turn
        self._write_holder(reason)
        self.emit("acquired", {"reason": reason})

    def release(self) -> None:
        """Drop the token (the caller has freed its device memory)."""
        if self._fd is None:
            return
        with self._mutex:
            if self._fd is None:
                return
            self.emit("released", {})
            self._handled = self._rung_at                # every ring so far is answered
            try:
                os.close(open_private(self.holder_path, os.O_WRONLY | os.O_TRUNC))
            except (OSError, ArenaError):
                pass
            fd, self._fd = self._fd, None
            _unlock(fd)
        try:                           # processes that wake on a free token look at once
            self.ring("released", event="free")
        except OSError as exc:
            log.warning("arena doorbell not rung: %s", exc)

    def held_for(self) -> float:
        """Seconds since this process took the token (0 when it does not hold it)."""
        return time.monotonic() - self._acquired_at if self._fd is not None else 0.0

    def rung_recently(self, window: float) -> bool:
        """Whether another process rang within the last `window` seconds (it waits for the
        token: a free token is about to be taken)."""
        return time.monotonic() - self._rung_at < window

    def poll(self) -> None:
        """Read the doorbell now (the watcher does so on every change and every POLL_S)."""
        self._poll()

    def yielded(self) -> float | None:
        """The end (wall-clock seconds) of a yield in force, else None."""
        self._poll()
        return self.yield_until if self.yield_until > time.time() else None

    def wanted(self) -> bool:
        """Whether this process holds the token and another one has rung for it since (or
        just before: a ring that came while the lock was changing hands counts too)."""
        return self._fd is not None and \
            self._rung_at > max(self._handled, self._acquired_at - self.ring_interval)

    def is_taken(self) -> bool:
        """Whether some process (this one included) holds the token now."""
        if self._fd is not None:
            return True
        fd = open_private(self.lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def holder(self) -> dict | None:
        """The holder file's {"pid", "t", "reason"} while the token is taken, else None."""
        if not self.is_taken():
            return None
        try:
            fd = open_private(self.holder_path, os.O_RDONLY)
            try:
                data = os.read(fd, MAX_LINE)
            finally:
                os.close(fd)
            obj = json.loads(data.decode("utf-8"))
        except (OSError, ArenaError, ValueError):
            return None
        return obj if isinstance(obj, dict) and type(obj.get("pid")) is int else None

    def retell(self, reason: str) -> None:
        """The holder file's reason anew, while this process holds the token (a job over,
        the token kept: what `hotseat yield` and a waiting process are told)."""
        if self.held:
            self._write_holder(reason)

    def _write_holder(self, reason: str) -> None:
        line = json.dumps({"pid": self.pid, "t": time.time(), "reason": reason[:200]})
        try:
            fd = open_private(self.holder_path, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, line.encode() + b"\n")
            finally:
                os.close(fd)
        except (OSError, ArenaError) as exc:             # diagnostics only
            log.warning("arena holder file not written: %s", exc)

    def _lock_or_wait(self, ring: dict, deadline: float | None,
                      respect_yield: bool) -> int | None:
        fd = open_private(self.lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        except BaseException:
            os.close(fd)
            raise
        waiter = _LockWaiter(fd)
        if self.on_event is not None:
            self.emit("waiting", {"holder": self.holder()})
        while True:
            self.ring(**ring)
            wait = self.ring_interval
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            if waiter.done.wait(wait):
                return waiter.take()
            self._poll()
            if respect_yield and self.yield_until > time.time():
                fd = waiter.abandon()
                if fd is not None:
                    _unlock(fd)
                return None
            if deadline is not None and time.monotonic() >= deadline:
                fd = waiter.abandon()
                if fd is not None:
                    return fd
                h = self.holder()
                who = f"Hotseat process {h['pid']} ({h.get('reason') or 'busy'})" if h \
                    else "another Hotseat process"
                raise ArenaBusy(f"the GPU is held by {who} and was not handed over in time")

    def _sit_out_yield(self, deadline: float | None) -> None:
        while True:
            self._poll()
            left = self.yield_until - time.time()
            if left <= 0:
                return
            if deadline is not None and time.monotonic() + left > deadline:
                raise ArenaBusy(f"the GPU is yielded to other programs until "
                                f"{time.strftime('%H:%M:%S', time.localtime(self.yield_until))}"
                                f" (by process {self.yield_by})", retry_after=left)
            with self._cond:
                self._cond.wait(min(left, POLL_S))

    # -- the doorbell ---------------------------------------------------------------------
    def ring(self, reason: str = "", until: float | None = None,
             event: str | None = None) -> None:
        """Append one line to the doorbell (a yield when `until` is given; a notice, not a
        ring, with an `event` of EVENTS)."""
        obj = {"pid": self.pid, "reason": reason[:200], "t": time.time()}
        if until is not None:
            obj["until"] = float(until)
        if event is not None:
            obj["event"] = event
        line = json.dumps(obj).encode() + b"\n"
        with self._write_lock:
            fcntl.flock(self._bell, fcntl.LOCK_EX)
            try:
                if os.fstat(self._bell).st_size > COMPACT_BYTES:
                    # cut the file back, keeping a yield still in force
                    keep = self._yield_line if self.yield_until > time.time() else b""
                    os.ftruncate(self._bell, 0)
                    if keep:
                        os.write(self._bell, keep)
                os.write(self._bell, line)
            finally:
                fcntl.flock(self._bell, fcntl.LOCK_UN)

    def yield_gpu(self, seconds: float, wait: float = 30.0) -> dict:
        """Ask every Hotseat process to go cold and stay off the GPU for `seconds`; then
        wait up to `wait` seconds for the token to be free. Returns {"until", "holder" (who
        held it when we rang, or None), "free" (whether it was handed over)}."""
        if not 0 < seconds <= MAX_YIELD_S:
            raise ValueError(f"a yield lasts more than 0 and at most {MAX_YIELD_S} s, "
                             f"got {seconds}")
        holder = self.holder()
        until = time.time() + seconds
        t0 = time.monotonic()
        self.ring("yield", until=until)
        free = True
        if self.is_taken():
            with self._mutex:
                try:
                    fd = self._lock_or_wait({"reason": "yield", "until": until},
                                            time.monotonic() + wait, respect_yield=False)
                    _unlock(fd)
                except ArenaBusy:
                    free = False
        return {"until": until, "holder": holder, "free": free,
                "seconds": time.monotonic() - t0}

    def cancel_yield(self) -> float | None:
        """End a yield in force now; the end it had, or None when none was in force."""
        until = self.yielded()
        self.ring("yield cancelled", event="cancel")
        with self._cond:
            self.yield_until = 0.0
            self._cond.notify_all()
        return until

    def _scan_tail(self) -> None:
        """A process starting up honours a yield already in force; older rings are past."""
        with self._read_lock:
            size = os.fstat(self._bell).st_size
            start = max(0, size - COMPACT_BYTES)
            data = os.pread(self._bell, size - start, start)
            self._offset = size
        for line in data.split(b"\n")[1 if start else 0:]:
            self._take_line(line, ring=False)

    def _poll(self) -> int:
        """Read the doorbell lines appended since the last look; the number of valid rings
        from other processes."""
        rings = []
        with self._read_lock:
            size = os.fstat(self._bell).st_size
            if size < self._offset:                    # cut back by a ringer
                self._offset, self._partial, self._skip = 0, b"", False
            if size - self._offset > MAX_BACKLOG:      # a flood: read the tail only
                self._offset, self._partial, self._skip = size - COMPACT_BYTES, b"", True
            while self._offset < size:
                chunk = os.pread(self._bell, min(1 << 16, size - self._offset), self._offset)
                if not chunk:
                    break
                self._offset += len(chunk)
                lines = (self._partial + chunk).split(b"\n")
                self._partial = lines.pop()
                for line in lines:
                    if self._skip:                     # the end of an overlong line
                        self._skip = False
                        continue
                    r = self._take_line(line, ring=True)
                    if r is not None:
                        rings.append(r)
                if len(self._partial) > MAX_LINE:
                    self._partial, self._skip = b"", True
        for r in rings:
            self.emit("rung", r)
        return len(rings)

    def _take_line(self, line: bytes, ring: bool) -> dict | None:
        r = parse_line(line)
        if r is None or r["pid"] == self.pid:
            return None
        if r["event"] == "cancel":
            with self._cond:
                if self.yield_until > time.time():
                    self.yield_ended = time.time()
                self.yield_until = 0.0
                self._cond.notify_all()
        if r["event"] is not None:             # a notice: nobody is asked to leave
            return None
        if r["until"] is not None:
            with self._cond:
                self.yield_until = min(r["until"], time.time() + MAX_YIELD_S)
                self.yield_ended = self.yield_until
                self.yield_by = r["pid"]
                self._yield_line = line + b"\n"
                self._cond.notify_all()
        if ring:
            self._rung_at = time.monotonic()
        return r

    # -- the watcher ----------------------------------------------------------------------
    def attach(self, on_ring: Callable[[], None],
               on_free: Callable[[], None] | None = None, label: str = "") -> None:
        """on_ring() runs on the watcher thread when another process rings while this one
        holds the token; it must free its device memory and call release(). Without one a
        ring is only reported ("rung"): the owner releases when its work is done. on_free()
        runs there too, when this process does not hold the token and the doorbell changed
        or POLL_S passed (a yield may be in force): a chance to take a free token back
        (try_acquire) or to let go of what a yield asks for. Attaching makes this process a member (`members()`), under label."""
        if self._on_ring is not None and self._on_ring != on_ring:
            raise ArenaError("this arena already serves an engine")
        self._on_ring, self._on_free = on_ring, on_free
        self._join(label)

    def detach(self, on_ring: Callable[[], None]) -> None:
        if self._on_ring == on_ring:
            self._on_ring = self._on_free = None
            self._leave()

    # -- members --------------------------------------------------------------------------
    def _members_dir(self) -> str:
        return prepare_dir(os.path.join(self.dir, MEMBERS_DIR))

    def _join(self, label: str) -> None:
        if self._member_fd >= 0:
            self.set_member(label=label)
            return
        d = self._members_dir()
        # locked under a temporary name, then renamed: a reader never sees it unlocked
        tmp = os.path.join(d, f"{self.pid}.tmp")
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        fd = open_private(tmp, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._member_fd = fd
        self._member = {"pid": self.pid, "label": label[:200], "waiting": False,
                        "since": time.time()}
        self._write_member()
        os.replace(tmp, os.path.join(d, f"{self.pid}.json"))

    def set_member(self, **fields) -> None:
        """Update what `members()` says of this process ("label", "waiting", ...)."""
        if self._member_fd < 0:
            return
        self._member.update(fields)
        self._write_member()

    def _write_member(self) -> None:
        data = json.dumps(self._member).encode()[:MAX_LINE]
        try:
            os.ftruncate(self._member_fd, 0)
            os.pwrite(self._member_fd, data, 0)
        except OSError as exc:                          # diagnostics only
            log.warning("arena member file not written: %s", exc)

    def _leave(self) -> None:
        if self._member_fd < 0:
            return
        try:
            os.unlink(os.path.join(self.dir, MEMBERS_DIR, f"{self.pid}.json"))
        except OSError:
            pass
        os.close(self._member_fd)
        self._member_fd = -1

    def members(self) -> list[dict]:
        """The live processes of the arena, by pid: {"pid", "label", "waiting", "since"};
        files left by dead processes are removed."""
        out = []
        d = os.path.join(self.dir, MEMBERS_DIR)
        try:
            names = sorted(os.listdir(d))
        except FileNotFoundError:
            return out
        for n in names:
            stem, dot, ext = n.partition(".")
            if ext != "json" or not stem.isdigit():
                continue
            path = os.path.join(d, n)
            try:
                fd = open_private(path, os.O_RDONLY)
            except ArenaError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    os.unlink(path)                     # nobody holds it: its process died
                    continue
                except BlockingIOError:
                    pass
                data = os.pread(fd, MAX_LINE, 0)
            except OSError:
                continue
            finally:
                os.close(fd)
            try:
                obj = json.loads(data.decode("utf-8"))
            except ValueError:                          # being rewritten just now
                obj = {}
            if not isinstance(obj, dict):
                obj = {}
            obj["pid"] = int(stem)
            out.append(obj)
        return out

    def _start_watching(self) -> None:
        from watchdog.events import (
            FileCreatedEvent,
            FileModifiedEvent,
            FileSystemEventHandler,
        )
        from watchdog.observers import Observer

        logging.getLogger("watchdog.observers.inotify").addFilter(_quiet_stop)

        arena = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if os.fsdecode(event.src_path) == arena.doorbell_path:
                    arena._wake.set()

        self._worker = threading.Thread(target=self._run, name="hotseat-arena", daemon=True)
        self._worker.start()
        self._observer = Observer()
        self._observer.daemon = True
        self._observer.schedule(Handler(), self.dir,
                                event_filter=[FileModifiedEvent, FileCreatedEvent])
        self._observer.start()

    def _run(self) -> None:
        while not self._closed:
            left = self.yield_until - time.time()      # wake when a yield ends, too
            self._wake.wait(min(POLL_S, left + 0.01) if left > 0 else POLL_S)
            self._wake.clear()
            if self._closed:
                return
            try:
                self._poll()
                on_ring = self._on_ring
                if on_ring is not None and self.wanted():
                    on_ring()
                on_free = self._on_free
                if on_free is not None and self._fd is None:
                    on_free()
            except Exception:                  # the watcher must outlive a bad callback
                log.exception("arena watcher")

    def emit(self, event: str, info: dict) -> None:
        """Tell on_event of an event: the arena's own, or its engine's ("handed": the
        release at a safe point, timed)."""
        if self.on_event is not None:
            try:
                self.on_event(event, info)
            except Exception:
                log.exception("arena on_event hook")

    def describe(self) -> dict:
        return {"dir": self.dir, "held": self.held, "holder": self.holder(),
                "yield_until": self.yielded()}

    def close(self) -> None:
        """Stop watching and drop the token if held."""
        self._closed = True
        self._wake.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=5)
        self.release()
        self._leave()
        if self._bell >= 0:
            os.close(self._bell)
            self._bell = -1

    def __enter__(self) -> "Arena":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
