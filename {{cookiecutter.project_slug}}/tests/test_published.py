"""Weights from elsewhere (utils/checkpoint/published.py): a checkpoint of this project given to ``--init-from`` or to
``python -m scripts.import_weights``, and what is refused in one line. Each example model's own published format (NVIDIA's,
jik876's) is tested in that model's test file, with a file laid out as that project writes it."""

import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TEST_MODEL, bound, finish, start_job, synth_corpus, tiny_checkpoint

from models import MODELS, config_schemas
from scripts import import_weights
from utils.checkpoint.files import CheckpointError
from utils.checkpoint.published import read_weights
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
    with pytest.raises(CheckpointError, match="cannot load it safely: refused by weights_only=True"):
        read_weights(tmp_path / "code.pt", MODELS, tiny_config())


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


@pytest.mark.slow
def test_init_from_another_model_is_refused_and_a_folder_with_its_own_checkpoint_resumes(tmp_path):
    corpus, out = synth_corpus(tmp_path / "corpus", n=10), tmp_path / "out"

    def train(*extra):
        return finish(start_job([sys.executable, "train.py", "--config", "config.json", "--model", TEST_MODEL, "--tiny",
                                 "--dataset-path", str(corpus), "--output-dir", str(out), "--set",
                                 "data.num_workers=0", *extra], tmp_path, nproc=1), timeout=bound(240, 1))
    others = [name for name in MODELS if name != TEST_MODEL]
    if others:
        other = tiny_checkpoint(others[0], tmp_path / "other.pt")
        code, output = train("--max-steps", "1", "--init-from", str(other))
        assert code == 1 and f"holds a '{others[0]}' model; this run trains '{TEST_MODEL}'" in output, output[-2000:]
    code, output = train("--max-steps", "1", "--init-from", str(tiny_checkpoint(TEST_MODEL, tmp_path / "own.pt")))
    assert code == 0 and f"initialised {TEST_MODEL} from {tmp_path / 'own.pt'}" in output, output[-2000:]
    code, output = train("--max-steps", "2", "--init-from", str(tmp_path / "own.pt"))
    assert code == 0 and "is not used" in output and "resumed from" in output, output[-2000:]
