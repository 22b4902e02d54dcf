"""An ONNX model's external data (weights kept in side files, `NAME.onnx.data`) read into the model itself.

torch's dynamo exporter (the default from torch 2.9, and what dlshogi's `convert_model_to_onnx.py` runs) writes
the larger tensors into a side file beside the model. onnxruntime, handed the model's bytes, looks for that file in
the working directory and refuses anything elsewhere ("escapes working directory"); handed the path, it opens the
side files itself, past the checks every file tideborn reads gets, and it still cannot run a model whose small
shape tensors are external. So the side files are read here, as the model is (regular files only, no links, inside
the model's folder, each tensor's bytes inside its file), and the tensors given their bytes, and the model runs
from memory like any other. Each problem is one `UserError` naming the model and the side file.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path, PurePosixPath

from tideborn.errors import UserError
from tideborn.safefile import NotARegularFile, link_target, open_regular_fd, os_error_text

MAX_MODEL_BYTES = (2 << 30) - 1
"""A model with its weights inside is one protobuf message, which cannot exceed 2 GiB (dlshogi's largest nets are
a few hundred MB)."""


def external_tensors(proto) -> list:
    """The tensors of `proto` whose bytes live in a side file: initialisers, Constant nodes' and other attributes'
    tensors, sparse ones, in subgraphs and functions too (where `onnx.save_model` may put them)."""
    from onnx import TensorProto

    found: list = []

    def graph_tensors(graph) -> None:
        found.extend(graph.initializer)
        for sparse in graph.sparse_initializer:
            found.extend((sparse.values, sparse.indices))
        nodes_tensors(graph.node)

    def nodes_tensors(nodes) -> None:
        for node in nodes:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    found.append(attribute.t)
                found.extend(attribute.tensors)
                if attribute.HasField("sparse_tensor"):
                    found.extend((attribute.sparse_tensor.values, attribute.sparse_tensor.indices))
                if attribute.HasField("g"):
                    graph_tensors(attribute.g)
                for graph in attribute.graphs:
                    graph_tensors(graph)

    graph_tensors(proto.graph)
    for function in proto.functions:
        nodes_tensors(function.node)
    return [tensor for tensor in found if tensor.data_location == TensorProto.EXTERNAL]


def inline_external_data(path: Path, proto, model_bytes: int) -> None:
    """Give every external tensor of `proto` (the model read from `path`, `model_bytes` long) its bytes from its
    side file, read as `_read_side_file` does, so that onnxruntime needs no file but the model's bytes.
    `UserError`, one line naming `path` and the side file, for a side file that is missing, a link, not a regular
    file, outside the model's folder, unreadable or too short for a tensor, and for a model past 2 GiB."""
    from onnx import TensorProto

    tensors = external_tensors(proto)
    folder = path.parent
    contents: dict[str, bytes] = {}
    total = model_bytes
    for tensor in tensors:
        entry = {item.key: item.value for item in tensor.external_data}
        location = entry.get("location", "")
        side = _side_file(path, folder, location, tensor.name)
        if location not in contents:
            contents[location] = _read_side_file(path, side, MAX_MODEL_BYTES - total)
            total += len(contents[location])
        data = contents[location]
        offset, length = _extent(path, tensor.name, entry, len(data))
        if offset + length > len(data):
            raise UserError(f"{path}: its external data file {side} is {len(data):,} bytes, too short for tensor "
                            f"{tensor.name!r} (bytes {offset:,} to {offset + length:,}); it is not this model's "
                            "or was cut short")
        tensor.raw_data = data[offset:offset + length]
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]


def _side_file(path: Path, folder: Path, location: str, tensor: str) -> Path:
    """The side file `location` names, relative to the model's folder, refused unless it stays inside it."""
    if not location:
        raise UserError(f"{path}: tensor {tensor!r} is external data with no location (side file) named")
    if any(ord(char) < 32 or ord(char) == 127 for char in location):  # NUL, escape sequences: never a name to show
        raise UserError(f"{path}: its external data location {location[:200]!r} (tensor {tensor!r}) is not a file "
                        "name")
    parts = PurePosixPath(location.replace("\\", "/"))
    if parts.is_absolute() or ".." in parts.parts or not parts.parts:
        raise UserError(f"{path}: its external data location {location[:200]!r} (tensor {tensor!r}) is outside the "
                        f"model's folder {folder}; a side file is read only from beside the model")
    side = folder.joinpath(*parts.parts)
    try:  # a folder on the way that is a link out of the model's folder counts as outside
        inside = side.parent.resolve(strict=True).is_relative_to(folder.resolve(strict=True))
    except OSError:
        inside = True  # missing: said as such when it is read
    if not inside:
        raise UserError(f"{path}: its external data file {side} is outside the model's folder {folder} (through "
                        "a linked folder); a side file is read only from beside the model")
    return side


def _read_side_file(path: Path, side: Path, most_bytes: int) -> bytes:
    """The whole of `side`, a regular file that is not a link (opened with O_NOFOLLOW), at most `most_bytes`."""
    try:
        fd, facts = open_regular_fd(side, follow_links=False)
    except FileNotFoundError:
        raise UserError(f"{path}: its external data file {side} is missing (the model keeps its weights there; "
                        "copy it beside the model under that name)") from None
    except NotARegularFile as exc:
        raise UserError(f"{path}: its external data file {side} is {exc.what}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{path}: its external data file {side} is a symbolic link{link_target(side)}; a side "
                            "file is read only as a regular file beside the model, never through a link") from None
        raise UserError(f"{path}: its external data file {side} cannot be read ({os_error_text(exc)})") from None
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(most_bytes + 1) if facts.st_size <= most_bytes else b""
        except OSError as exc:
            raise UserError(f"{path}: its external data file {side} cannot be read ({os_error_text(exc)})") from None
    if facts.st_size > most_bytes or len(data) > most_bytes:
        raise UserError(f"{path}: with its external data file {side} ({max(facts.st_size, len(data)):,} bytes) the "
                        "model is past 2 GiB, more than one ONNX model in memory can hold")
    return data


def _extent(path: Path, tensor: str, entry: dict[str, str], size: int) -> tuple[int, int]:
    """(offset, length) of a tensor's bytes in its side file; no length: to the end of the file."""
    try:
        offset = int(entry.get("offset", "0"))
        length = int(entry["length"]) if "length" in entry else size - offset
    except ValueError:
        raise UserError(f"{path}: tensor {tensor!r} has an external data offset or length that is not a whole "
                        f"number ({entry.get('offset')!r}, {entry.get('length')!r})") from None
    if offset < 0 or length < 0:
        raise UserError(f"{path}: tensor {tensor!r} has a negative external data offset or length "
                        f"({offset}, {length})")
    return offset, length
