"""`prepare` on the command line: the user's datasets are never replaced unasked."""

import io
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config import Config, replace
from {{ cookiecutter.package_name }}.data import embedded_corpus, pieces, prepare
from {{ cookiecutter.package_name }}.tokenizers import CharTokenizer, GPT2Tokenizer

NOTES = "My notes, line one.\nAnd the second line.\n" * 200


@pytest.fixture
def cli(capsys):
    """Run the command line; its exit code, stdout and stderr."""

    def run(*args) -> tuple[int, str, str]:
        code = main([str(arg) for arg in args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def shakespeare(cli, tmp_path) -> Path:
    """data_dir with the embedded corpus prepared, as `prepare` does by default."""
    data = tmp_path / "data"
    code, _, err = cli("prepare", "--preset=tiny", f"--data_dir={data}")
    assert code == 0, err
    return data


def test_an_input_file_without_dataset_becomes_a_dataset_named_after_it(
    cli, shakespeare, tmp_path
):
    before = files_of(shakespeare / "shakespeare_char")
    (tmp_path / "my notes.txt").write_text(NOTES, encoding="utf-8")
    code, out, err = cli("prepare", "--preset=tiny", f"--data_dir={shakespeare}",
                         f"--input_file={tmp_path / 'my notes.txt'}")  # fmt: skip
    assert code == 0, err
    assert f"prepared {shakespeare / 'my_notes'} from" in out
    assert f"train --dataset=my_notes --data_dir={shakespeare}" in out
    assert files_of(shakespeare / "shakespeare_char") == before


def test_preparing_other_text_into_an_existing_dataset_is_refused(
    cli, shakespeare, tmp_path
):
    before = files_of(shakespeare / "shakespeare_char")
    (tmp_path / "notes.txt").write_text(NOTES, encoding="utf-8")
    args = ("prepare", "--preset=tiny", f"--data_dir={shakespeare}",
            f"--input_file={tmp_path / 'notes.txt'}",
            "--dataset=shakespeare_char")  # fmt: skip
    code, _, err = cli(*args)
    assert code == 1
    assert "already holds dataset 'shakespeare_char', prepared from the embedded" in err
    assert "--overwrite=true" in err
    assert files_of(shakespeare / "shakespeare_char") == before
    code, _, err = cli(*args, "--overwrite=true")
    assert code == 0, err
    assert files_of(shakespeare / "shakespeare_char") != before


def test_preparing_the_same_text_again_is_allowed(cli, shakespeare):
    before = files_of(shakespeare / "shakespeare_char")
    code, out, err = cli("prepare", "--preset=tiny", f"--data_dir={shakespeare}")
    assert code == 0, err
    assert files_of(shakespeare / "shakespeare_char") == before


def test_the_prepare_hint_keeps_the_data_dir(cli, tmp_path):
    code, _, err = cli("train", "--preset=tiny", f"--data_dir={tmp_path / 'mine'}",
                       f"--out_dir={tmp_path / 'out'}")  # fmt: skip
    assert code == 1
    assert (
        f"run `{{ cookiecutter.project_slug }} prepare --dataset=shakespeare_char"
        f" --data_dir={tmp_path / 'mine'} --tokenizer=char` first"
    ) in err


def test_a_data_dir_that_cannot_be_written_fails_before_tokenizing(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, out, err = cli("prepare", f"--data_dir={blocker / 'data'}")
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert f"--data_dir={blocker / 'data'}: cannot write there" in err


def test_tokenizing_in_pieces_gives_the_ids_of_the_whole_text_char():
    text = embedded_corpus()
    parts = pieces(text, size=10_000)
    assert len(parts) > 100 and "".join(parts) == text
    tokenizer = CharTokenizer.from_text(text)
    assert [i for p in parts for i in tokenizer.encode(p)] == tokenizer.encode(text)


def test_tokenizing_in_pieces_gives_the_ids_of_the_whole_text_gpt2():
    text = embedded_corpus()[:200_000]
    parts = pieces(text, size=5_000)
    tokenizer = GPT2Tokenizer()
    assert [i for p in parts for i in tokenizer.encode(p)] == tokenizer.encode(text)


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_prepare_shows_its_progress_on_a_terminal(tmp_path):
    terminal = Terminal()
    cfg = replace(Config.for_preset("tiny"), data_dir=str(tmp_path))
    prepare(cfg, log=lambda _: None, stream=terminal)
    shown = terminal.getvalue()
    assert "\rtokenizing the embedded Shakespeare corpus [" in shown
    assert "characters" in shown
    assert shown.endswith("\r")  # the bar is cleared when done
