"""The exec helper: the program every job unit runs in front of the job (stageunit.py's ExecStart=).

Its own module, with nothing but its source, because the exec-tree listener
(execwatch.py) recognises it in a job's tree and should not load the unit
code to do so (a start's imports are cold-start CPU, issue 50).
"""

from __future__ import annotations

HELPER_EXIT_CHANGED = 126

# Runs as ExecStart of every job unit (python3 -I -S -c): argv is
# [path, dev, ino, uid, mode, cwd, argv0, args...]; uid and mode are "-" for
# unprivileged jobs; cwd is "dev:ino" of the working directory the runner holds
# ("-": not checked, the reviewer's fixed "/").  The environment arrives
# hex-encoded in AIRLOCK_JOB_ENV; reviewed scripts (index:sha256:root-only copy, hex-encoded) in AIRLOCK_JOB_SCRIPTS:
# each is read, checked and sealed into a memfd that replaces argv[index].
# Its imports are the cheapest that do the job (each job's start pays for them):
# posix, _stat and _signal are built in, where os, stat and signal would import
# posixpath, collections.abc, enum and more (14.5 ms of CPU per start with them, 6.7
# without: a bare interpreter is 6.6); fcntl and hashlib only for reviewed scripts.
# posix.environ is the environment as bytes.
HELPER = """\
import posix as os, sys, _signal, _stat
path, dev, ino, uid, mode, cwd = sys.argv[1:7]
def refuse(why):
    os.write(2, ("airlock: %s: %s since it was approved; not executed\\n" % (path, why)).encode())
    os._exit(126)
if cwd != "-":
    here = os.stat(".")
    if "%d:%d" % (here.st_dev, here.st_ino) != cwd:
        os.write(2, b"airlock: the working directory is not the one the runner checked"
                 b" (renamed or swapped); not executed\\n")
        os._exit(126)
parts = [p for p in path.split("/") if p]
if not path.startswith("/") or not parts or any(p in (".", "..") for p in parts):
    refuse("is not a canonical path")
fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
try:
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        flags = os.O_PATH | os.O_NOFOLLOW | (0 if last else os.O_DIRECTORY)
        nfd = os.open(part, flags, dir_fd=fd)
        os.close(fd)
        fd = nfd
except OSError as exc:
    refuse("cannot be opened without following a symlink (%s)" % exc.strerror)
st = os.fstat(fd)
if not _stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (int(dev), int(ino)):
    refuse("is not the file the runner checked")
if uid != "-" and (st.st_uid, _stat.S_IMODE(st.st_mode)) != (int(uid), int(mode)):
    refuse("changed owner or mode")
data = bytes.fromhex(os.environ.get(b"AIRLOCK_JOB_ENV", b"").decode())
env = dict(item.split(b"=", 1) for item in data.split(b"\\0") if item)
if os.environ.get(b"CREDENTIALS_DIRECTORY"):  # the rule's credentials (LoadCredential=, runner/credentials.py)
    env[b"CREDENTIALS_DIRECTORY"] = os.environ[b"CREDENTIALS_DIRECTORY"]
args = sys.argv[7:]
for item in bytes.fromhex(os.environ.get(b"AIRLOCK_JOB_SCRIPTS", b"").decode()).decode().split(";"):
    if not item:
        continue
    import fcntl, hashlib
    index, digest, copy = item.split(":", 2)
    sfd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW)
    chunks = []
    while True:
        chunk = os.read(sfd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(sfd)
    script = b"".join(chunks)
    if hashlib.sha256(script).hexdigest() != digest:
        refuse("the script copy is not the reviewed script")
    mfd = os.memfd_create("airlock-script", os.MFD_ALLOW_SEALING)
    view = memoryview(script)
    while view:
        view = view[os.write(mfd, view):]
    seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
    fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, seals)
    args[int(index)] = "/proc/self/fd/%d" % mfd
_signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
_signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
os.set_inheritable(fd, True)
try:
    os.execve("/proc/self/fd/%d" % fd, args, env)
except OSError as exc:
    os.write(2, ("airlock: cannot execute %s: %s\\n" % (path, exc.strerror)).encode())
    os._exit(127 if exc.errno == 2 else 126)
"""
