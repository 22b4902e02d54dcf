"""A net whose weights are in a side file (ONNX external data, `NAME.onnx.data`, as torch's exporter writes for
dlshogi's `convert_model_to_onnx.py`) plays in `tideborn match` and `tideborn usi` from any working directory, the
same moves as the net with its weights inside; a side file that is missing, a link, a FIFO, outside the model's
folder or too short is one line naming it and exit status 2. (onnxruntime, handed the model's bytes, looked for
the side file in the working directory and refused the net: "External data path ... escapes working directory".)"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import onnx
import pytest

from tests.helpers.common import assert_user_error
from tests.helpers.usi import InProcessEngine, tiny_checkpoint
from tideborn.export.onnx_export import export_onnx
from tideborn.match.cli import main as match_main
from tideborn.network.checkpoint import load_checkpoint
from tideborn.usi.cli import main as usi_main
from tideborn.usi.session import open_engine

MATCH = ["--games", "4", "--max-moves", "24", "--json"]


def save_with_external_data(model: onnx.ModelProto, path: Path, location: str | None = None,
                            size_threshold: int = 0) -> None:
    """`model` saved at `path` with every tensor of `size_threshold` bytes or more (default: every one) in one side
    file, `location` (default `NAME.onnx.data`, beside it); the location written into the model is changed
    afterwards when it is not a plain name (onnx writes the side file where the location says)."""
    data_name = f"{path.name}.data"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data_name,
                    size_threshold=size_threshold)
    if location is not None:
        saved = onnx.load(str(path), load_external_data=False)
        for tensor in saved.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save_model(saved, str(path))


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 1x8 checkpoint, its export with the weights inside (`plain.onnx`), and the same export re-saved with
    every tensor in `nets/net.onnx.data`; and with only the tensors of 1 KiB or more outside, as torch's exporter
    writes them (`nets/torch-like.onnx`, whose small shape tensors onnxruntime can read inside)."""
    root = tmp_path_factory.mktemp("external")
    checkpoint = tiny_checkpoint(root)
    plain = root / "plain.onnx"
    export_onnx(load_checkpoint(checkpoint), plain, value="logit")
    (root / "nets").mkdir()
    external = root / "nets" / "net.onnx"
    save_with_external_data(onnx.load(str(plain)), external)
    assert (root / "nets" / "net.onnx.data").stat().st_size > external.stat().st_size  # the weights are outside
    torch_like = root / "nets" / "torch-like.onnx"
    save_with_external_data(onnx.load(str(plain)), torch_like, size_threshold=1024)
    return {"root": root, "checkpoint": checkpoint, "plain": plain, "external": external, "torch-like": torch_like}


def _match(capsys, *players: str | Path) -> tuple[int, str, str]:
    code = match_main([str(player) for player in players] + MATCH)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("net", "where"), [("external", "elsewhere"), ("external", "root"),
                                            ("torch-like", "elsewhere")])
def test_a_net_with_external_data_plays_from_any_working_directory(nets, tmp_path, monkeypatch, capsys, net, where):
    """From an unrelated folder (the model named by its absolute path) and from the folder above the model's (named
    relatively): the external-data net plays the moves its weights-inside twin plays."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere if where == "elsewhere" else nets["root"])
    model = nets[net] if where == "elsewhere" else nets[net].relative_to(nets["root"])
    code, out, err = _match(capsys, nets["checkpoint"], model)
    assert code == 0, err
    report = json.loads(out)
    assert report["second"]["kind"] == "onnx" and report["second"]["path"] == str(model)
    code, out, err = _match(capsys, nets["checkpoint"], nets["plain"])
    assert code == 0, err
    twin = json.loads(out)
    assert (report["moves"], report["ends"], report["score"]) == (twin["moves"], twin["ends"], twin["score"])


def test_tideborn_usi_runs_a_net_with_external_data_from_another_folder(nets, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    moves = []
    for model in (nets["external"], nets["plain"]):
        session = InProcessEngine(open_engine(model))
        try:
            session.send("isready")
            session.expect("readyok")
            session.send("position startpos moves 7g7f")
            session.send("go byoyomi 1000")
            line, _ = session.expect("bestmove")
            moves.append(line)
        finally:
            session.close()
    assert moves[0] == moves[1] and moves[0] != "bestmove resign", moves


def _copy(nets, folder: Path, *, data: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(nets["external"], folder / "net.onnx")
    if data:
        shutil.copy(nets["external"].with_name("net.onnx.data"), folder / "net.onnx.data")
    return folder / "net.onnx"


def _missing(nets, tmp_path: Path) -> tuple[Path, str]:
    model = _copy(nets, tmp_path / "copy", data=False)
    return model, rf"its external data file {re.escape(str(model))}\.data is missing"


def _link(nets, tmp_path: Path) -> tuple[Path, str]:
    model = _copy(nets, tmp_path / "copy", data=False)
    (model.parent / "net.onnx.data").symlink_to(nets["external"].with_name("net.onnx.data"))
    return model, rf"its external data file {re.escape(str(model))}\.data is a symbolic link \(to .*net\.onnx\.data\)"


def _fifo(nets, tmp_path: Path) -> tuple[Path, str]:
    model = _copy(nets, tmp_path / "copy", data=False)
    os.mkfifo(model.parent / "net.onnx.data")  # opened, it would block the reader until a writer came
    return model, rf"its external data file {re.escape(str(model))}\.data is a FIFO \(named pipe\), not a regular file"


def _truncated(nets, tmp_path: Path) -> tuple[Path, str]:
    model = _copy(nets, tmp_path / "copy")
    side = model.parent / "net.onnx.data"
    os.truncate(side, side.stat().st_size // 2)
    return model, rf"its external data file {re.escape(str(side))} is [\d,]+ bytes, too short for tensor"


def _outside(nets, tmp_path: Path) -> tuple[Path, str]:
    """The location `../net.onnx.data`, where a file of that name is."""
    (tmp_path / "copy").mkdir()
    shutil.copy(nets["external"].with_name("net.onnx.data"), tmp_path / "net.onnx.data")
    model = tmp_path / "copy" / "net.onnx"
    save_with_external_data(onnx.load(str(nets["external"])), model, location="../net.onnx.data")
    return model, r"its external data location '\.\./net\.onnx\.data' .* is outside the model's folder"


def _linked_folder(nets, tmp_path: Path) -> tuple[Path, str]:
    """The location `weights/net.onnx.data`, where `weights` is a link to a folder elsewhere."""
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(nets["external"].with_name("net.onnx.data"), tmp_path / "elsewhere" / "net.onnx.data")
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "weights").symlink_to(tmp_path / "elsewhere")
    model = tmp_path / "copy" / "net.onnx"
    save_with_external_data(onnx.load(str(nets["external"])), model, location="weights/net.onnx.data")
    return model, r"its external data file .*weights/net\.onnx\.data is outside the model's folder .* linked folder"


def _escape_sequence(nets, tmp_path: Path) -> tuple[Path, str]:
    """A location with a terminal escape sequence in it: never shown as it is, never opened."""
    (tmp_path / "copy").mkdir()
    model = tmp_path / "copy" / "net.onnx"
    save_with_external_data(onnx.load(str(nets["external"])), model, location="\x1b[2Jnet.onnx.data")
    return model, r"its external data location '\\x1b\[2Jnet\.onnx\.data' .* is not a file name"


SIDE_FILE_PROBLEMS = {"missing": _missing, "link": _link, "fifo": _fifo, "truncated": _truncated,
                      "outside": _outside, "linked folder": _linked_folder, "escape sequence": _escape_sequence}


@pytest.mark.parametrize("problem", SIDE_FILE_PROBLEMS)
def test_a_side_file_that_cannot_be_read_safely_is_one_line_naming_it(nets, tmp_path, monkeypatch, capsys, problem):
    model, message = SIDE_FILE_PROBLEMS[problem](nets, tmp_path)
    monkeypatch.chdir(tmp_path)
    code, out, err = _match(capsys, nets["checkpoint"], model)
    assert code == 2 and out == ""
    assert_user_error(err, rf"{re.escape(str(model))}: {message}")


def test_tideborn_usi_names_a_missing_side_file(nets, tmp_path, monkeypatch, capsys):
    model, message = _missing(nets, tmp_path)
    monkeypatch.chdir(tmp_path)
    assert usi_main([str(model)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_user_error(err, rf"{re.escape(str(model))}: {message}")
