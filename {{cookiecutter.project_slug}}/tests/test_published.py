"""Weights from elsewhere (utils/checkpoint/published.py): a checkpoint of this project given to ``--init-from`` or to
``python -m scripts.import_weights``, and what is refused in one line. Each example model's own published formats
(NVIDIA's, jik876's) are tested in that model's test files, with files laid out as that project writes them.
``tests/test_parity_<model>.py`` have every published variant."""

import io
import pickle
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TEST_MODEL, OpensAFile, run_train_main, synth_corpus, tiny_checkpoint

from models import MODELS, config_schemas
from scripts import import_weights
from utils.checkpoint.files import CheckpointError
from utils.checkpoint.published import LEGACY_MAGIC, read_weights
from utils.config import load_config

pytestmark = pytest.mark.skipif(TEST_MODEL is None, reason="no model is registered in model.py")


def tiny_config():
    return load_config(str(Path(ROOT) / "config.json"), config_schemas(), tiny=True)


def test_a_checkpoint_of_this_project_is_read_and_a_file_of_no_known_format_is_one_line(tmp_path):
    checkpoint = tiny_checkpoint(TEST_MODEL, tmp_path / "own.pt")
    weights = read_weights(checkpoint, MODELS, tiny_config())
    assert weights.model_name == TEST_MODEL and weights.source == f"a checkpoint of model '{TEST_MODEL}' at step 0"
    torch.save({"weights": {"a": torch.zeros(1)}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a checkpoint of this project, nor a published checkpoint a model"):
        read_weights(tmp_path / "other.pt", MODELS, tiny_config())
    with pytest.raises(CheckpointError, match="no such file or folder"):
        read_weights(tmp_path / "missing.pt", MODELS, tiny_config())
    (tmp_path / "code.pt").write_bytes(b"\x80\x04\x95\x18\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94"
                                       b"\x93\x94.")  # a pickle that names os.system
    with pytest.raises(CheckpointError, match="cannot load it safely: pickle data was truncated"):
        read_weights(tmp_path / "code.pt", MODELS, tiny_config())
    for legacy, message in ((False, "refused by weights_only=True"),
                            (True, "it holds code: it names io.open, which is refused")):
        torch.save({"model": OpensAFile(tmp_path / "ran")}, tmp_path / "code.pt",
                   _use_new_zipfile_serialization=not legacy)
        with pytest.raises(CheckpointError, match=f"cannot load it safely: {message}"):
            read_weights(tmp_path / "code.pt", MODELS, tiny_config())
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


@pytest.mark.slow
def test_init_from_another_model_is_refused_and_a_folder_with_its_own_checkpoint_resumes(tmp_path):
    corpus, out = synth_corpus(tmp_path / "corpus", n=10), tmp_path / "out"

    def train(*extra):  # in this process: what is proven is --init-from and --resume, not the launch
        code, out_text, err = run_train_main(["--config", "config.json", "--model", TEST_MODEL, "--tiny",
                                              "--dataset-path", str(corpus), "--output-dir", str(out), "--set",
                                              "data.num_workers=0", *extra])
        return code, out_text + err
    others = [name for name in MODELS if name != TEST_MODEL]
    if others:
        other = tiny_checkpoint(others[0], tmp_path / "other.pt")
        code, output = train("--max-steps", "1", "--init-from", str(other))
        assert code == 1 and f"holds a '{others[0]}' model; this run trains '{TEST_MODEL}'" in output, output[-2000:]
    code, output = train("--max-steps", "1", "--init-from", str(tiny_checkpoint(TEST_MODEL, tmp_path / "own.pt")))
    assert code == 0 and f"initialised {TEST_MODEL} from {tmp_path / 'own.pt'}" in output, output[-2000:]
    code, output = train("--max-steps", "2", "--init-from", str(tmp_path / "own.pt"))
    assert code == 0 and "is not used" in output and "resumed from" in output, output[-2000:]


def test_pytorchs_legacy_format_is_read_without_running_it_and_damage_is_one_line(tmp_path):
    """Files of PyTorch before 1.6 (``_use_new_zipfile_serialization=False``; NVIDIA's published WaveGlow): read by
    the restricted reader. A plain dict reads (then no model takes it); code, or a file cut short, is refused."""
    path = tmp_path / "old.pt"
    torch.save({"weights": {"a": torch.arange(6.0).reshape(2, 3)[:, 1:]}}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="not a checkpoint of this project, nor a published checkpoint"):
        read_weights(path, MODELS, tiny_config())
    data = path.read_bytes()
    for cut in (10, len(data) // 2, len(data) - 5):
        (tmp_path / "cut.pt").write_bytes(data[:cut])
        damaged = r"(: cannot load it safely:| is damaged| is not a checkpoint)"  # by the loader, or by the size check
        with pytest.raises(CheckpointError, match=rf"^--init-from \S+cut.pt{damaged}[^\n]+$"):
            read_weights(tmp_path / "cut.pt", MODELS, tiny_config())
    header = b"".join(pickle.dumps(item, protocol=2) for item in (LEGACY_MAGIC, 1001, {"little_endian": True}))
    (tmp_path / "code.pt").write_bytes(header + pickle.dumps({"model": OpensAFile(tmp_path / "ran")}, protocol=2))
    with pytest.raises(CheckpointError, match="it names io.open, which is refused"):
        read_weights(tmp_path / "code.pt", MODELS, tiny_config())
    assert not (tmp_path / "ran").exists()

    class DeclaresATerabyte(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", 2 ** 40, None) if obj is DeclaresATerabyte else None

    buffer = io.BytesIO()
    DeclaresATerabyte(buffer, protocol=2).dump({"model": DeclaresATerabyte})
    (tmp_path / "huge.pt").write_bytes(header + buffer.getvalue())
    with pytest.raises(CheckpointError, match="its tensors need more bytes than the file holds"):
        read_weights(tmp_path / "huge.pt", MODELS, tiny_config())
