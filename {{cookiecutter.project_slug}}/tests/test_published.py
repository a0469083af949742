"""Weights from elsewhere (utils/checkpoint/published.py): files given to ``--init-from`` or to ``python -m
scripts.import_weights``, and what is refused in one line (a checkpoint of this project given to ``--init-from``:
``tests/test_weights.py``); every loader's check of a file in PyTorch's legacy format (the bytes its tensors declare,
before anything is allocated). Each example model's own published formats
(NVIDIA's, jik876's) are tested in that model's test files, with files laid out as that project writes them.
``tests/test_parity_<model>.py`` have every published variant."""

import io
import pickle
import random
import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TEST_MODEL, OpensAFile, reframed_checkpoint, run_main, tiny_checkpoint
from test_checkpoint_safety import FILE_ROUTES, assert_refused, craft, single  # noqa: F401 (fixture)

from models import MODELS
from parts import PARTS, config_schemas
from scripts import import_weights
from utils.checkpoint.files import CheckpointError, load_checkpoint, torch_file_problem
from utils.checkpoint.published import LEGACY_MAGIC
from utils.checkpoint.weights import read_weights
from utils.config import load_config

pytestmark = pytest.mark.skipif(TEST_MODEL is None, reason="no model is registered in model.py")


def tiny_config():
    return load_config(str(Path(ROOT) / "config.json"), config_schemas(), tiny=True)


def test_a_file_of_no_known_format_is_one_line(tmp_path):
    torch.save({"weights": {"a": torch.zeros(1)}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a checkpoint of this project, nor a published checkpoint a model"):
        read_weights(tmp_path / "other.pt", MODELS, tiny_config(), formats=PARTS.formats)
    (tmp_path / "code.pt").write_bytes(b"\x80\x04\x95\x18\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94"
                                       b"\x93\x94.")  # a pickle that names os.system
    with pytest.raises(CheckpointError, match="cannot load it safely: pickle data was truncated"):
        read_weights(tmp_path / "code.pt", MODELS, tiny_config(), formats=PARTS.formats)
    for legacy, message in ((False, "refused by weights_only=True"),
                            (True, "it holds code: it names io.open, which is refused")):
        torch.save({"model": OpensAFile(tmp_path / "ran")}, tmp_path / "code.pt",
                   _use_new_zipfile_serialization=not legacy)
        with pytest.raises(CheckpointError, match=f"cannot load it safely: {message}"):
            read_weights(tmp_path / "code.pt", MODELS, tiny_config(), formats=PARTS.formats)
    assert not (tmp_path / "ran").exists(), "loading the file ran its code"


def test_import_weights_names_what_it_cannot_do_in_one_line(tmp_path, capsys):
    checkpoint = tiny_checkpoint(TEST_MODEL, tmp_path / "own.pt")
    out = tmp_path / "copy.pt"
    assert import_weights.main([str(checkpoint), "--output", str(out), "--tiny"]) == 0
    assert f"wrote {out}: model '{TEST_MODEL}'" in capsys.readouterr().out
    for args, message in (([str(checkpoint), "--output", str(out), "--tiny"], "exists; pass --force"),
                          ([str(tmp_path / "nope.pt"), "--output", str(tmp_path / "x.pt")], "no such file"),
                          ([str(checkpoint), "--output", str(tmp_path / "no" / "x.pt")], "does not exist")):
        assert import_weights.main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ERROR: ") and message in err[0], err
        assert "--init-from" not in err[0], err  # an option of train.py, not of this script


def test_an_imported_checkpoint_of_this_project_keeps_the_framing_it_was_trained_on(tmp_path, capsys):
    """``scripts.import_weights`` of a checkpoint of ``train.py`` records its ``audio.mel_framing`` (here not its
    model's reference), whatever the config's (replaced, and its line says so); a file an earlier import wrote, which
    recorded null, takes its model's reference framing (``ModelSpec.recipe``) as ``train.py`` would."""
    reference = MODELS[TEST_MODEL].recipe.get("audio.mel_framing", "jik876")
    framing = {"nvidia": "jik876", "jik876": "nvidia"}[reference]
    own = reframed_checkpoint(tiny_checkpoint(TEST_MODEL, tmp_path / "own.pt"), tmp_path / "own.pt", framing)
    for sets, said in (([], f"; audio.mel_framing={framing}\n"),
                       (["--set", f"audio.mel_framing={reference}"], f"; audio.mel_framing={framing}, replacing the "
                        f"config's {reference}: the framing its weights were trained on\n")):
        assert import_weights.main([str(own), "--output", str(tmp_path / "copy.pt"), "--tiny", "--force", *sets]) == 0
        assert capsys.readouterr().out.endswith(said)
        assert torch.load(tmp_path / "copy.pt", weights_only=True)["config"]["audio"]["mel_framing"] == framing
    early = reframed_checkpoint(own, tmp_path / "early.pt", None, {"source": "published.pt"})
    assert import_weights.main([str(early), "--output", str(tmp_path / "copy.pt"), "--tiny", "--force"]) == 0
    assert torch.load(tmp_path / "copy.pt", weights_only=True)["config"]["audio"]["mel_framing"] == reference


def test_random_bytes_after_a_pickles_first_byte_are_named_as_no_checkpoint_by_every_loader(tmp_path, capsys):
    """0x80 starts every pickle: random bytes after it are named as what they are in one line, not in the unpickler's
    words (``unsupported pickle protocol``, ``invalid load key``), by ``inference.py``'s loader, ``--init-from``'s and
    ``scripts.import_weights`` (nothing written)."""
    neither = "is not a checkpoint: neither a file torch.save writes (a zip archive) nor a pickle"
    for seed in range(8):
        path = tmp_path / f"random80_{seed}.pt"
        path.write_bytes(b"\x80" + random.Random(seed).randbytes(4095))
        with pytest.raises(CheckpointError, match=f"^{re.escape(f'{path} {neither}')}$"):
            load_checkpoint(path, legacy=PARTS.formats.legacy)
        with pytest.raises(CheckpointError, match=f"^{re.escape(f'--init-from {path} {neither}')}$"):
            read_weights(path, MODELS, None, formats=PARTS.formats)
        assert import_weights.main([str(path), "--output", str(tmp_path / "out.pt")]) == 1
        assert capsys.readouterr().err == f"ERROR: the weights file {path} {neither}\n"
    assert not (tmp_path / "out.pt").exists()


def tool_calls(where: Path) -> dict:
    """The after-training tools' calls on a checkpoint path, each giving ``run_main``'s completed process: the routes
    of ``tests/test_checkpoint_safety.py`` that these tools add."""
    return {"import_weights": lambda path: run_main("scripts.import_weights", str(path), "--tiny", "--output",
                                                    str(where / "imported.pt"), check=False),
            "export": lambda path: run_main("scripts.export", "--checkpoint", str(path), "--format", "release",
                                            "--output", str(where / "release.pt"), check=False)}


@pytest.mark.parametrize("tool", ["import_weights", "export"])
@pytest.mark.parametrize("route", sorted(FILE_ROUTES))
def test_a_pt_file_holding_code_is_refused_by_the_tools(single, tmp_path, route, tool):  # noqa: F811
    _, out = single
    path, marker = craft(route, out / "checkpoint_2.pt", tmp_path)
    done = tool_calls(tmp_path)[tool](path)
    assert_refused(done.returncode, done.stderr, marker, path)


def test_pytorchs_legacy_format_is_read_without_running_it_and_damage_is_one_line(tmp_path):
    """Files of PyTorch before 1.6 (``_use_new_zipfile_serialization=False``; NVIDIA's published WaveGlow): read by
    the restricted reader. A plain dict reads (then no model takes it); code, or a file cut short, is refused."""
    path = tmp_path / "old.pt"
    torch.save({"weights": {"a": torch.arange(6.0).reshape(2, 3)[:, 1:]}}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="not a checkpoint of this project, nor a published checkpoint"):
        read_weights(path, MODELS, tiny_config(), formats=PARTS.formats)
    data = path.read_bytes()
    for cut in (10, len(data) // 2, len(data) - 5):
        (tmp_path / "cut.pt").write_bytes(data[:cut])
        damaged = r"(: cannot load it safely:| is damaged| is not a checkpoint)"  # by the loader, or by the size check
        with pytest.raises(CheckpointError, match=rf"^--init-from \S+cut.pt{damaged}[^\n]+$"):
            read_weights(tmp_path / "cut.pt", MODELS, tiny_config(), formats=PARTS.formats)
    header = b"".join(pickle.dumps(item, protocol=2) for item in (LEGACY_MAGIC, 1001, {"little_endian": True}))
    (tmp_path / "code.pt").write_bytes(header + pickle.dumps({"model": OpensAFile(tmp_path / "ran")}, protocol=2))
    with pytest.raises(CheckpointError, match="it names io.open, which is refused"):
        read_weights(tmp_path / "code.pt", MODELS, tiny_config(), formats=PARTS.formats)
    assert not (tmp_path / "ran").exists()

    class DeclaresATerabyte(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", 2 ** 40, None) if obj is DeclaresATerabyte else None

    buffer = io.BytesIO()
    DeclaresATerabyte(buffer, protocol=2).dump({"model": DeclaresATerabyte})
    (tmp_path / "huge.pt").write_bytes(header + buffer.getvalue())
    with pytest.raises(CheckpointError, match="its tensors need more bytes than the file holds"):
        read_weights(tmp_path / "huge.pt", MODELS, tiny_config(), formats=PARTS.formats)


def legacy_file(path, storages, tail: bytes = b"") -> None:
    """A file in PyTorch's legacy format (before 1.6) whose object refers to ``storages`` ({key: (storage type, element
    count)}, or a list of such pairs: a key may come twice), then ``tail``."""
    header = b"".join(pickle.dumps(item, protocol=2) for item in (torch.serialization.MAGIC_NUMBER, 1001,
                                                                  {"little_endian": True}))

    class Storage(tuple):
        pass

    class Refers(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", obj[1], obj[0], "cpu", obj[2], None) if isinstance(obj, Storage) else None
    buffer = io.BytesIO()
    refs = storages.items() if isinstance(storages, dict) else storages
    Refers(buffer, protocol=2).dump({"model": [Storage((key, *kind)) for key, kind in refs]})
    path.write_bytes(header + buffer.getvalue() + tail)


def test_a_legacy_file_declaring_more_bytes_than_it_holds_is_refused_before_any_allocation(tmp_path):
    """A few hundred bytes that declare a 4 TiB storage: refused by its size on every loader, never allocated."""
    path = tmp_path / "huge.pt"
    legacy_file(path, {"0": (torch.FloatStorage, 2 ** 40)})
    size = path.stat().st_size
    assert size < 400
    damaged = f"is damaged (its tensors need more bytes than the file holds: {2 ** 42} declared, "
    with pytest.raises(CheckpointError, match=f"^{re.escape(f'{path} {damaged}')}"):
        load_checkpoint(path, legacy=PARTS.formats.legacy)
    with pytest.raises(CheckpointError, match=f"^{re.escape(f'--init-from {path} {damaged}')}"):
        read_weights(path, MODELS, None, formats=PARTS.formats)
    # Two storages of 3 floats and 6 bytes need 18 bytes after the pickles.
    for tail, fits in ((bytes(17), False), (bytes(18), True)):
        legacy_file(path, {"a": (torch.FloatStorage, 3), "b": (torch.ByteStorage, 6)}, tail)
        assert (torch_file_problem(path, PARTS.formats.legacy) is None) == fits, torch_file_problem(path, PARTS.formats.legacy)


def test_a_legacy_storage_named_twice_counts_at_the_size_torch_load_allocates(tmp_path):
    """torch.load allocates a storage at its key's first reference: a later, small one does not hide a huge first."""
    path = tmp_path / "twice.pt"
    for refs in ([("0", (torch.FloatStorage, 2 ** 40)), ("0", (torch.FloatStorage, 1))],
                 [(0, (torch.FloatStorage, 2 ** 40)), ("0", (torch.FloatStorage, 1))]):  # two keys to torch.load
        legacy_file(path, refs, bytes(64))
        problem = torch_file_problem(path, PARTS.formats.legacy) or ""
        declared = re.match(r"is damaged \(its tensors need more bytes than the file holds: (\d+) declared", problem)
        assert declared and int(declared.group(1)) >= 2 ** 42, problem
