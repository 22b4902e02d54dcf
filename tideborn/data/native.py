"""The compiled loops (`compiled.py`) as a process gets them: built ahead of time into a small extension module,
or compiled by numba's JIT.

numba's JIT costs every process that uses it about 0.35 s before the first call, even from its on-disk cache: the
import of numba and of the typing and target registries a dispatcher needs. That is a quarter of a first open of a
million hcpe3 positions, and it is paid again by each trainer, each `torchrun` rank and each tool. So
`scripts/setup.sh` builds the same functions once, ahead of time, with numba's `pycc` into
`tideborn/data/_loops_<key>.<python suffix>.so`: a process then imports only that module (a millisecond, numpy
beside it, no numba). numba marks pycc "pending deprecation" since 0.57 with no replacement yet; it is still there
(0.68), and where it is missing, where there is no C compiler, or where the build is older than the sources (the
key is a hash of them, of numba's and numpy's versions, and of this CPU), the JIT is used as before: same code, same
results, only the 0.35 s more.

A module built ahead of time checks no argument type (a wrong dtype reads the wrong memory): every call goes
through `SIGNATURES` here, which both builds agree to and which the callers' arguments are checked against.

    python -m tideborn.data.native build   # build it for this checkout and CPU (scripts/setup.sh runs it)
    python -m tideborn.data.native which   # which build a process gets, and why
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import typing
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tideborn.errors import report_interrupted
from tideborn.safefile import SCRATCH_MARK, publish, remove_stale_scratch

HERE = Path(__file__).resolve().parent
PREFIX = "_loops_"
SOURCES = ("compiled.py", "hcpe3_ops.py", "native.py")
"""What the built module is made of: a change to any of them makes it stale."""

_IN, _OUT, _FILE = "in", "out", "file"
"""How an entry point uses an array: reads it; writes it (it must be writable); reads a file's read-only bytes
(the JIT types those apart, so the warm-up passes read-only ones)."""
SIGNATURES: dict[str, tuple[str, tuple[tuple[str, int, str], ...]]] = {
    # name: (return type, per argument (dtype, dimensions (0: an int), use)); every array C-contiguous
    "decode_batch": ("none", (("u1", 2, _IN), ("i8", 1, _IN), ("b1", 1, _IN), ("u1", 2, _IN), ("i8", 1, _IN),
                              ("i8", 1, _IN), ("u1", 3, _OUT), ("u1", 2, _OUT), ("i8", 1, _OUT), ("u1", 1, _OUT))),
    "play_games": ("none", (("u1", 2, _IN), ("b1", 1, _IN), ("i8", 1, _IN), ("i4", 1, _IN), ("i8", 1, _IN),
                            ("u1", 2, _OUT), ("u1", 1, _OUT), ("u1", 1, _OUT))),
    "walk_games": ("i8x3", (("u2", 1, _FILE), ("i8", 0, _IN), ("i8", 0, _IN), ("i8", 0, _IN), ("i8", 1, _OUT),
                            ("i8", 1, _OUT), ("i8", 1, _OUT))),
    "replay_range": ("bool", (("u1", 2, _IN), ("i8", 1, _IN), ("i8", 1, _IN), ("i8", 0, _IN), ("u1", 2, _OUT))),
}
_DTYPES = {"u1": np.dtype(np.uint8), "u2": np.dtype(np.uint16), "i4": np.dtype(np.int32),
           "i8": np.dtype(np.int64), "b1": np.dtype(np.bool_)}

_loops: SimpleNamespace | None = None


def host_cpu() -> tuple[str, str]:
    """This CPU's name and features as LLVM names them (what numba's JIT compiles for)."""
    import llvmlite.binding as llvm  # about 30 ms; numba's import is what this module spares

    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def key() -> str:
    """The built module's name part: its sources, the compiler's and numpy's versions, and this CPU."""
    sources = hashlib.sha256()
    for name in SOURCES:
        sources.update((HERE / name).read_bytes())
    sources.update(f"numba {importlib.metadata.version('numba')} numpy {np.__version__}".encode())
    cpu = hashlib.sha256(" ".join(host_cpu()).encode())
    return f"{sources.hexdigest()[:16]}_{cpu.hexdigest()[:8]}"


def _checked(name: str, function: typing.Callable, spec: tuple[tuple[str, int, str], ...]) -> typing.Callable:
    """`function` behind a check of each argument against `spec`: a TypeError naming the entry point and the
    argument, where the built module would read the wrong memory and the JIT would compile again."""
    wanted = [(_DTYPES[dtype], ndim, use) for dtype, ndim, use in spec]

    def call(*args):
        if len(args) != len(wanted):
            raise TypeError(f"{name}: {len(args)} arguments, not {len(wanted)}")
        for position, (arg, (dtype, ndim, use)) in enumerate(zip(args, wanted)):
            if ndim == 0:
                if not isinstance(arg, (int, np.integer)) or isinstance(arg, bool):
                    raise TypeError(f"{name}: argument {position} must be an int, not {type(arg).__name__}")
            elif not (isinstance(arg, np.ndarray) and arg.dtype == dtype and arg.ndim == ndim
                      and arg.flags.c_contiguous and (use != _OUT or arg.flags.writeable)):
                got = (f"{arg.ndim}-d {arg.dtype}{'' if arg.flags.c_contiguous else ', not C-contiguous'}"
                       f"{'' if arg.flags.writeable else ', read-only'}" if isinstance(arg, np.ndarray)
                       else type(arg).__name__)
                raise TypeError(f"{name}: argument {position} must be a C-contiguous {ndim}-d {dtype}"
                                f"{' writable' if use == _OUT else ''} array, not {got}")
        return function(*args)

    call.__name__ = call.__qualname__ = name
    return call


def _built_module(module_key: str) -> typing.Any | None:
    """The module built ahead of time for `module_key`, or None where there is none (or it does not load)."""
    try:
        return importlib.import_module(f"tideborn.data.{PREFIX}{module_key}")
    except ImportError:  # not built, built for another Python, or a damaged file: the JIT serves
        return None


def _namespace(module: typing.Any, origin: str) -> SimpleNamespace:
    return SimpleNamespace(built_ahead=origin != "numba", origin=origin,
                           **{name: _checked(name, getattr(module, name), spec)
                              for name, (_, spec) in SIGNATURES.items()})


def jit() -> SimpleNamespace:
    """The entry points under numba's JIT, checked as `loops()`'s are."""
    from tideborn.data import compiled  # here: numba's import, only where nothing is built ahead of time

    return _namespace(compiled, "numba")


def loops() -> SimpleNamespace:
    """The entry points of `compiled.py`, each checked against `SIGNATURES`, from the module built ahead of time
    where it is current, else from numba's JIT (`built_ahead` says which; `origin` names the file or "numba")."""
    global _loops
    if _loops is None:
        module = _built_module(key())
        _loops = jit() if module is None else _namespace(module, module.__file__)
    return _loops


def examples(name: str) -> tuple:
    """Arguments of `name`'s types with nothing in them (a call that only loads or compiles the entry point)."""
    args = []
    for dtype, ndim, use in SIGNATURES[name][1]:
        if ndim == 0:
            args.append(0)
        elif use == _FILE:
            args.append(np.frombuffer(b"", dtype=_DTYPES[dtype]))
        else:
            args.append(np.zeros((0,) * ndim, dtype=_DTYPES[dtype]))
    return tuple(args)


def prepare_decoder() -> None:
    """Load `decode_batch` in this process: one that forks loader workers calls it first, and they inherit it
    (each would otherwise load it again, up to 0.35 s a worker and an epoch under the JIT)."""
    loops().decode_batch(*examples("decode_batch"))


def warm_jit() -> None:
    """Compile every entry point under numba's JIT (or load it from numba's cache), for the types of
    `SIGNATURES`: the fallback where no module is built ahead of time (about 7 s once on a 2-core machine)."""
    from tideborn.data import compiled

    for name in SIGNATURES:
        getattr(compiled, name)(*examples(name))


@contextlib.contextmanager
def _host_features():
    """numba's ahead-of-time codegen names the CPU but takes the features its model implies; a virtual machine
    may hide some of them (AVX-512, say). Give it this CPU's real features, as numba's JIT takes them."""
    from numba.core.codegen import AOTCPUCodegen

    original = AOTCPUCodegen._customize_tm_features
    AOTCPUCodegen._customize_tm_features = lambda self: self._get_host_cpu_features()
    try:
        yield
    finally:
        AOTCPUCodegen._customize_tm_features = original


@contextlib.contextmanager
def _errors_to_output():
    """The C compiler's warnings (it writes to the process's stderr) to stdout, where pycc writes the rest: stderr
    keeps only the line that says the build failed (scripts/setup.sh shows it and logs the rest)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(1, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


SMOKE = r"""
import importlib, sys
import cshogi
import numpy as np
sys.path.insert(0, sys.argv[1])
module = importlib.import_module(sys.argv[2])
board = cshogi.Board()
hcp = np.zeros((1, 32), np.uint8)
board.to_hcp(hcp[0])
move = cshogi.move16(board.move_from_usi("7g7f"))
planes, hands = np.zeros((1, 62, 81), np.uint8), np.zeros((1, 57), np.uint8)
labels, status = np.zeros(1, np.int64), np.zeros(1, np.uint8)
none = np.zeros(0, np.int64)
module.decode_batch(hcp, np.array([move], np.int64), np.ones(1, np.bool_), hcp, none, none, planes, hands, labels,
                    status)
assert status[0] == 1 and planes.sum() > 0, "the start position did not decode"
out = np.zeros((1, 32), np.uint8)
assert module.replay_range(hcp, np.zeros(1, np.int64), none, 0, out) and (out == hcp).all(), "no replay"
print("ok")
"""


def build(out: typing.TextIO = sys.stdout, directory: Path = HERE) -> Path:
    """Build the module ahead of time for this checkout and CPU, check it in a child process, and put it in
    `directory` (beside this file, where the import finds it) under its key, by a rename: a process sees the whole
    module or none. Older builds are removed. Raises where it cannot be built (no pycc, no C compiler, a directory
    it cannot write)."""
    from numba import from_dtype, types
    from numba.core.errors import NumbaPendingDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)  # pycc: see the module's docstring
        from numba.pycc import CC

    from tideborn.data import compiled

    returns = {"none": types.none, "bool": types.boolean, "i8x3": types.UniTuple(types.int64, 3)}
    module_key = key()
    name = PREFIX + module_key
    # The working folder, `._loops.scratch-PID-...`: removed however the build ends, and by the next build where a
    # SIGKILL left it (its process gone).
    remove_stale_scratch(directory / "_loops", folders=True)
    with tempfile.TemporaryDirectory(prefix=f"._loops{SCRATCH_MARK}{os.getpid()}-", dir=directory) as scratch:
        cc = CC(name)
        cc.output_dir = scratch
        cc.target_cpu = host_cpu()[0]
        for entry, (returned, spec) in SIGNATURES.items():
            arguments = [types.Array(from_dtype(_DTYPES[dtype]), ndim, "C") if ndim else from_dtype(_DTYPES[dtype])
                         for dtype, ndim, _ in spec]
            cc.export(entry, returns[returned](*arguments))(getattr(compiled, entry).py_func)
        # pycc's object files (its own temporary folder, which it removes only when it succeeds) in here too
        saved_tempdir, tempfile.tempdir = tempfile.tempdir, scratch
        try:
            with _host_features(), _errors_to_output():
                cc.compile()
        finally:
            tempfile.tempdir = saved_tempdir
        built = [path for path in Path(scratch).iterdir() if path.name.startswith(name)]
        if len(built) != 1:
            raise RuntimeError(f"numba's pycc left {[p.name for p in Path(scratch).iterdir()]} in {scratch}")
        smoke = subprocess.run([sys.executable, "-c", SMOKE, scratch, name], capture_output=True, text=True,
                               timeout=120)
        if smoke.returncode != 0 or smoke.stdout.split() != ["ok"]:
            lines = (smoke.stderr or smoke.stdout).strip().splitlines()
            raise RuntimeError(f"the module built ahead of time fails its check (exit {smoke.returncode}): "
                               f"{lines[-1] if lines else 'no output'}")
        target = directory / built[0].name
        publish([(built[0], target)])
    for old in directory.glob(PREFIX + "*"):
        if old != target and not old.name.startswith(f"{PREFIX}{module_key.split('_')[0]}_"):
            with contextlib.suppress(OSError):  # another CPU's build of the same sources is kept (a shared tree)
                old.unlink()
    print(f"built {target.name}", file=out)
    return target


def build_or_fall_back(directory: Path = HERE) -> bool:
    """`build`, or where it fails, one line that says why and numba's JIT compiled instead (its cache filled):
    what scripts/setup.sh runs. True where the module was built."""
    try:
        build(directory=directory)
    except Exception as exc:  # noqa: BLE001 - the JIT is the fallback: say why, warm it, and go on
        reason = (str(exc).strip().splitlines() or [""])[0]
        if len(reason) > 200:  # a compiler's error quotes its whole command line: that is in the build's output
            reason = reason[:200] + " ..."
        print(f"tideborn: the compiled loops are not built ahead of time ({type(exc).__name__}: {reason}); numba's "
              f"JIT serves them, about 0.35 s more per process", file=sys.stderr)
        warm_jit()
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _command(argv)
    except KeyboardInterrupt:  # the build publishes its module whole by a rename, or nothing
        return report_interrupted(f"python -m tideborn.data.native {' '.join(argv)}".rstrip())


def _command(argv: list[str]) -> int:
    if argv == ["which"]:
        found = loops()
        print(f"{'built ahead of time: ' if found.built_ahead else 'numba JIT (no current build ahead of time): '}"
              f"{found.origin}")
        return 0
    if argv == ["build"]:
        build_or_fall_back()
        return 0
    print("usage: python -m tideborn.data.native build|which", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
