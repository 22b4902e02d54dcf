#!/usr/bin/env bash
# Create or update ./.venv with tideborn (editable), its dev group and a torch build that fits
# this machine. Safe to re-run: when nothing changed it is a sub-second no-op.
#
#   ./scripts/setup.sh [-q|--quiet]
#
# Environment knobs:
#   TIDEBORN_TORCH=cpu|cu129        torch flavour (default: cu129 if `nvidia-smi` works, else cpu)
#   TIDEBORN_TORCH_VERSION=X.Y.Z    torch version for the pip path (default 2.13.0; uv uses pyproject/uv.lock)
#   TIDEBORN_ALLOW_CUDA_TORCH=1     allow a CUDA torch build on a machine without nvidia-smi
#   TIDEBORN_INSTALLER=auto|uv|pip  force the installer (default auto: uv when on PATH and the
#                                   PyTorch index is reachable, else pip)
#   TIDEBORN_PYTHON=/path/python    interpreter for a new .venv on the pip path (needs >= 3.11)
#   TIDEBORN_SETUP_VERBOSE=1        stream pip output instead of logging it to .venv/tideborn-setup.log
set -euo pipefail

# Ctrl-C at any moment: one line, exit status 130. It reaches the whole foreground job: the command running (pip,
# python) ends, its words going to $LOG or nowhere, and this runs once it has: not pip's log, nor a "failed". The
# stamps are written last, so an interrupted setup is finished by the next run.
CHANGING=0  # 1 once .venv is being changed (the stamp removed first, written again only when all is done)
interrupted() {
    trap - INT
    [[ -z "${REPORT:-}" ]] || rm -f "$REPORT"
    [[ ! -t 2 ]] || printf '\r\033[K' >&2  # over the terminal's ^C
    if [[ $CHANGING == 1 ]]; then
        echo "setup.sh: interrupted (Ctrl-C); .venv is not finished: run scripts/setup.sh again" >&2
    else
        echo "setup.sh: interrupted (Ctrl-C); .venv left as it was" >&2
    fi
    exit 130
}
trap interrupted INT

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

QUIET=0
for arg in "$@"; do
    case "$arg" in
        -q|--quiet) QUIET=1 ;;
        -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

VENV=".venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.tideborn-setup"
LOG="$VENV/tideborn-setup.log"
DEFAULT_TORCH_VERSION="2.13.0"
TORCH_VERSION="${TIDEBORN_TORCH_VERSION:-$DEFAULT_TORCH_VERSION}"
ALLOW_CUDA="${TIDEBORN_ALLOW_CUDA_TORCH:-0}"
INSTALLER="${TIDEBORN_INSTALLER:-auto}"
VERBOSE="${TIDEBORN_SETUP_VERBOSE:-0}"
PYTORCH_INDEX="https://download.pytorch.org/whl"

say()  { echo "[setup] $*"; }
die()  { echo "[setup] ERROR: $*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

with_timeout() {  # with_timeout SECONDS CMD... (plain CMD where coreutils timeout is missing)
    local s="$1"; shift
    if have timeout; then timeout "$s" "$@"; else "$@"; fi
}

sha256() {  # sha256 FILE -> hex digest, "-" when the file does not exist
    if [[ ! -f "$1" ]]; then echo "-"
    elif have sha256sum; then sha256sum "$1" | cut -d' ' -f1
    elif have shasum; then shasum -a 256 "$1" | cut -d' ' -f1
    else python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
    fi
}

# ---------------------------------------------------------------------------- torch flavour
case "${TIDEBORN_TORCH:-}" in
    cpu|cu129) FLAVOUR="$TIDEBORN_TORCH"; WHY="TIDEBORN_TORCH=$TIDEBORN_TORCH" ;;
    "")
        if have nvidia-smi && with_timeout 20 nvidia-smi >/dev/null 2>&1; then
            FLAVOUR="cu129"; WHY="nvidia-smi works"
        else
            FLAVOUR="cpu"; WHY="no working nvidia-smi"
        fi ;;
    *) die "TIDEBORN_TORCH must be 'cpu' or 'cu129' (got '${TIDEBORN_TORCH}')" ;;
esac
case "$INSTALLER" in auto|uv|pip) ;; *) die "TIDEBORN_INSTALLER must be auto, uv or pip (got '$INSTALLER')" ;; esac

# --------------------------------------------------------------------------- up-to-date check
# The stamp covers everything that decides what gets installed; uv.lock only exists on the uv path.
stamp_value() {
    echo "v1 flavour=$FLAVOUR torch=${TIDEBORN_TORCH_VERSION:-default} allow_cuda=$ALLOW_CUDA" \
        "pyproject=$(sha256 pyproject.toml) uvlock=$(sha256 uv.lock) setup=$(sha256 "${BASH_SOURCE[0]}")"
}

venv_ok() {  # the venv runs and has both torch and tideborn installed (metadata only: fast)
    [[ -x "$VPY" ]] && "$VPY" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md, sys
assert sys.version_info >= (3, 11)
md.version("torch"); md.version("tideborn")
EOF
}

if [[ -f "$STAMP" && "$(cat "$STAMP" 2>/dev/null)" == "$(stamp_value)" ]] && venv_ok; then
    [[ $QUIET == 1 ]] || say ".venv is up to date (torch flavour $FLAVOUR: $WHY); nothing to do"
    exit 0
fi

# Serialize concurrent runs on the same checkout (e.g. parallel CI jobs) where flock exists.
if have flock; then
    LOCK="${TMPDIR:-/tmp}/tideborn-setup-$(printf '%s' "$ROOT" | cksum | cut -d' ' -f1).lock"
    exec 9>"$LOCK"
    flock 9
fi

say "torch flavour: $FLAVOUR ($WHY)"

begin_changes() {  # from here .venv changes: no stamp says it is set up until `finish` writes it again
    CHANGING=1
    rm -f "$STAMP"
}

PYTORCH_REACHABLE=""
pytorch_index_reachable() {  # cached quick probe (~5 s max) of the PyTorch wheel index
    if [[ -z "$PYTORCH_REACHABLE" ]]; then
        if python3 - "$PYTORCH_INDEX/$FLAVOUR/" <<'EOF' >/dev/null 2>&1
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=5)
    sys.exit(0 if r.status < 400 else 1)
except urllib.error.HTTPError as e:
    sys.exit(0 if e.code == 405 else 1)   # server answered but dislikes HEAD: reachable
except Exception:
    sys.exit(1)
EOF
        then PYTORCH_REACHABLE=yes; else PYTORCH_REACHABLE=no; fi
    fi
    [[ "$PYTORCH_REACHABLE" == yes ]]
}

finish() {
    local torch_desc
    torch_desc="$("$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo '?')"
    stamp_value > "$STAMP"   # recomputed: uv sync may just have written uv.lock
    say "done: .venv ready (torch $torch_desc, flavour $FLAVOUR)"
    if [[ $QUIET == 0 ]]; then
        say "use: .venv/bin/tideborn --help | .venv/bin/tideborn-tui | ./scripts/test.sh"
        say "     (or 'source .venv/bin/activate' and then plain 'tideborn ...')"
    fi
    exit 0
}

# ------------------------------------------------------------------------------- uv path
USE_UV=0
if [[ "$INSTALLER" == uv ]]; then
    have uv || die "TIDEBORN_INSTALLER=uv but uv is not on PATH"
    USE_UV=1
elif [[ "$INSTALLER" == auto ]] && have uv; then
    if pytorch_index_reachable; then USE_UV=1; else say "uv found but $PYTORCH_INDEX is unreachable: using pip"; fi
fi

if [[ $USE_UV == 1 ]]; then
    say "installing with: uv sync --extra $FLAVOUR (project + dev group + torch from the PyTorch $FLAVOUR index)"
    [[ -z "${TIDEBORN_TORCH_VERSION:-}" ]] || say "note: TIDEBORN_TORCH_VERSION is ignored by uv (torch comes from pyproject.toml/uv.lock)"
    begin_changes
    UV_PROJECT_ENVIRONMENT="$ROOT/$VENV" uv sync --extra "$FLAVOUR"
    venv_ok || die "uv sync finished but torch/tideborn are not importable from $VENV"
    finish
fi

# ------------------------------------------------------------------------------ pip path
run_logged() {  # run_logged DESCRIPTION CMD...: output to $LOG (or the terminal when verbose)
    local desc="$1"; shift
    if [[ "$VERBOSE" == 1 ]]; then
        "$@" || die "$desc failed"
    else
        echo "### $(date '+%F %T') $desc: $*" >> "$LOG"
        if ! "$@" >> "$LOG" 2>&1; then
            echo "[setup] ---- last lines of $LOG ----" >&2
            grep -v "is ignored: it is neither a file nor a directory" "$LOG" | tail -n 30 >&2
            die "$desc failed (full log: $LOG)"
        fi
    fi
}

pick_python() {
    local c
    for c in ${TIDEBORN_PYTHON:-} python3 python3.13 python3.12 python3.11; do
        if have "$c" && "$c" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
            echo "$c"; return 0
        fi
    done
    return 1
}

make_venv() {  # make_venv ARGS...: python -m venv, what it says shown only if it fails (never a Ctrl-C's traceback)
    local said
    said="$("$PY" -m venv "$@" 2>&1)" || { echo "$said" >&2; die "making $VENV with $PY failed"; }
}

if [[ -x "$VPY" ]] && "$VPY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
    begin_changes
    say "venv: reusing $VENV ($("$VPY" -c 'import platform; print(platform.python_version())' 2>/dev/null))"
else
    PY="$(pick_python)" || die "need Python >= 3.11 with the venv module (set TIDEBORN_PYTHON=/path/to/python3.11+)"
    begin_changes
    if [[ -e "$VENV" ]]; then
        say "venv: $VENV is broken or too old, recreating it with $PY"
        make_venv --clear "$VENV"
    else
        say "venv: creating $VENV with $PY ($("$PY" -c 'import platform; print(platform.python_version())' 2>/dev/null))"
        make_venv "$VENV"
    fi
fi
: > "$LOG"

# uv-made venvs have no pip; pip >= 25.1 is needed for `--group`.
if ! "$VPY" -m pip --version >/dev/null 2>&1; then
    run_logged "ensurepip" "$VPY" -m ensurepip --upgrade
fi
if "$VPY" -c 'import pip, sys; v = tuple(int(x) for x in pip.__version__.split(".")[:2]); sys.exit(v >= (25, 1))' 2>/dev/null; then
    say "pip: upgrading the venv's pip (>= 25.1 is needed for --group)"
    run_logged "pip upgrade" "$VPY" -m pip install --upgrade "pip>=25.1"
fi

# Classify a torch distribution: prints "<cuda|rocm|cpu> <version> <detail>".
# Mode "installed": the torch in the venv (none -> "none"); mode "report FILE": a pip --report.
TORCH_KIND_PY='
import json, re, sys
def kind(version, dep_names):
    local = version.partition("+")[2]
    gpu = sorted((n for n in dep_names if n.startswith(("nvidia-", "cuda-")) and n != "nvidia-ml-py"),
                 key=lambda n: (not n.startswith("nvidia-"), n))
    if local.startswith("cu") or gpu:
        return "cuda", ",".join(gpu[:3]) + (f",...({len(gpu)}_CUDA_packages)" if len(gpu) > 3 else "")
    if local.startswith("rocm"):
        return "rocm", ""
    return "cpu", ""
if sys.argv[1] == "report":
    items = json.load(open(sys.argv[2])).get("install", [])
    names = [re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower() for i in items]
    torch = [i for i in items if i["metadata"]["name"].lower() == "torch"]
    if not torch:
        print("none - -"); sys.exit()
    version = torch[0]["metadata"]["version"]
else:
    import importlib.metadata as md
    try:
        dist = md.distribution("torch")
    except md.PackageNotFoundError:
        print("none - -"); sys.exit()
    version, names = dist.version, []
    for r in dist.requires or []:
        try:
            from pip._vendor.packaging.requirements import Requirement
            req = Requirement(r)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            names.append(re.sub(r"[-_.]+", "-", req.name).lower())
        except Exception:
            names.append(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0].lower())
k, detail = kind(version, names)
print(k, version, detail or "no-CUDA-deps")
'

acceptable() {  # acceptable KIND VERSION: is an installed torch of this kind/version fine here?
    local k="$1" v="$2"
    [[ "$k" == none ]] && return 1
    if [[ -n "${TIDEBORN_TORCH_VERSION:-}" && "${v%%+*}" != "$TIDEBORN_TORCH_VERSION" ]]; then return 1; fi
    if [[ "$FLAVOUR" == cpu ]]; then
        [[ "$k" == cpu || ( "$k" == cuda && "$ALLOW_CUDA" == 1 ) ]]
    else
        [[ "$k" == cuda ]]
    fi
}

installed_torch() {  # sets CUR_KIND CUR_VERSION from the venv
    local out
    out="$("$VPY" -c "$TORCH_KIND_PY" installed 2>>"$LOG")" || die "could not inspect the torch installed in $VENV (see $LOG)"
    read -r CUR_KIND CUR_VERSION _ <<< "$out"
}

installed_torch
if acceptable "$CUR_KIND" "$CUR_VERSION"; then
    say "torch: $CUR_VERSION ($CUR_KIND build) already installed, keeping it"
else
    WANT="torch==$TORCH_VERSION"
    INDEX_ARGS=()
    if pytorch_index_reachable; then
        INDEX_ARGS=(--index-url "$PYTORCH_INDEX/$FLAVOUR")
        SOURCE="the PyTorch $FLAVOUR index"
    else
        SOURCE="pip's configured indexes (PyTorch index unreachable)"
    fi
    # Resolve first (no install) to see which build pip would pick, unless we are taking a CUDA
    # build from the PyTorch cu129 index anyway (that would only download ~1 GB twice).
    if [[ "$FLAVOUR" == cpu || ${#INDEX_ARGS[@]} == 0 ]]; then
        say "torch: checking which build pip would pick for $WANT (dry run)"
        REPORT="$VENV/tideborn-torch-report.json"
        run_logged "resolving $WANT" "$VPY" -m pip install --dry-run --quiet --ignore-installed \
            --report "$REPORT" ${INDEX_ARGS[@]+"${INDEX_ARGS[@]}"} "$WANT"
        OUT="$("$VPY" -c "$TORCH_KIND_PY" report "$REPORT" 2>>"$LOG")" || die "could not read pip's report $REPORT (see $LOG)"
        read -r NEW_KIND NEW_VERSION NEW_DETAIL <<< "$OUT"
        rm -f "$REPORT"
        REPORT=""
        [[ "$NEW_KIND" != none ]] || die "pip resolved $WANT to nothing?! (see $LOG)"
        if [[ "$FLAVOUR" == cpu && "$NEW_KIND" == cuda ]]; then
            if [[ "$ALLOW_CUDA" == 1 ]]; then
                say "WARNING: installing a CUDA torch build ($NEW_VERSION) without nvidia-smi, as TIDEBORN_ALLOW_CUDA_TORCH=1 asks"
            else
                cat >&2 <<EOF
[setup] ERROR: refusing to install torch $NEW_VERSION: it is a multi-GB CUDA build
[setup]        (pulls ${NEW_DETAIL//_/ }), but this machine has no working nvidia-smi
[setup]        (torch flavour cpu). That is what $WANT resolves to from $SOURCE.
[setup]        Ways forward:
[setup]          - with internet access: uv sync --extra cpu   (or install uv and re-run this script)
[setup]          - pick a version that has a CPU build here: TIDEBORN_TORCH_VERSION=$DEFAULT_TORCH_VERSION $0
[setup]          - really want the CUDA build anyway: TIDEBORN_ALLOW_CUDA_TORCH=1 $0
EOF
                exit 1
            fi
        elif [[ "$FLAVOUR" == cu129 && "$NEW_KIND" != cuda ]]; then
            say "WARNING: a GPU is present but $SOURCE only offer a $NEW_KIND build ($NEW_VERSION);"
            say "         torch will not use the GPU. With internet access use: uv sync --extra cu129"
        fi
    fi
    if [[ "$CUR_KIND" != none ]]; then
        say "torch: removing unsuitable torch $CUR_VERSION ($CUR_KIND build)"
        REMOVE=(torch)
        if [[ "$CUR_KIND" == cuda && "$FLAVOUR" == cpu ]]; then
            # also drop the CUDA runtime wheels that came with it (nvidia-ml-py is ours: keep it)
            # shellcheck disable=SC2207  # distribution names: no spaces or glob characters
            REMOVE+=($("$VPY" -c '
import importlib.metadata as md
names = {(d.metadata["Name"] or "").lower() for d in md.distributions()}
print(" ".join(sorted(n for n in names if (n.startswith(("nvidia-", "cuda-")) or n == "triton") and n != "nvidia-ml-py")))' 2>>"$LOG"))
        fi
        run_logged "uninstalling ${REMOVE[*]}" "$VPY" -m pip uninstall -y "${REMOVE[@]}"
    fi
    say "torch: installing $WANT from $SOURCE"
    run_logged "installing $WANT" "$VPY" -m pip install ${INDEX_ARGS[@]+"${INDEX_ARGS[@]}"} "$WANT"
    installed_torch
    say "torch: installed $CUR_VERSION ($CUR_KIND build)"
    if [[ "$FLAVOUR" == cpu && "$CUR_KIND" == cuda && "$ALLOW_CUDA" != 1 ]]; then
        die "a CUDA torch build ended up installed despite the check; remove it: $(printf '%q' "$VPY") -m pip uninstall -y torch"
    fi
fi

say "project: pip install -e . --group dev"
run_logged "installing the project" "$VPY" -m pip install -e . --group dev
venv_ok || die "install finished but torch/tideborn are not importable from $VENV (see $LOG)"
finish
