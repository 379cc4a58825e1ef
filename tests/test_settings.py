"""`owsandbox settings`: every setting is listed with what it does, and a secret's value is not shown."""

from __future__ import annotations

import pytest

from owsandbox import cli, settings

pytestmark = pytest.mark.unit


def test_every_setting_is_listed_with_its_meaning(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.NETWORK, "1")
    monkeypatch.delenv(settings.IMAGE, raising=False)
    assert cli.main(["settings"]) == 0
    out = capsys.readouterr().out
    for setting in settings.describe():
        assert f"{setting.name}=" in out and setting.meaning in out
    assert f"{settings.NETWORK}=1\n" in out and f"{settings.IMAGE}=\n" in out


def test_a_secret_is_said_to_be_set_but_not_shown(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.EXECD_TOKEN, "s3cret-token")
    monkeypatch.setenv(settings.OPENSANDBOX_API_KEY, "s3cret-key")
    assert cli.main(["settings"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out and f"{settings.EXECD_TOKEN}=(set, not shown)" in out


def test_names_are_unique_and_all_owsandbox() -> None:
    names = [setting.name for setting in settings.describe()]
    assert len(names) == len(set(names)) and all(name.startswith("OWSANDBOX_") for name in names)


def test_what_the_list_says_of_a_setting_is_what_its_reader_takes() -> None:
    """The examples in `owsandbox settings` are the readers' own words: each limit name parses, and the
    baseline's magic is the one `%snapshot` has."""
    import re

    from owsandbox.host.isolation.resources import LIMIT_NAMES, Limits
    from owsandbox.kernel.magics.teaching import SNAPSHOT_USAGE

    meaning = {setting.name: setting.meaning for setting in settings.describe()}
    examples = re.findall(r"\b([a-z]+=[0-9.]+[A-Z]?)", meaning[settings.LIMITS])
    assert sorted(example.split("=")[0] for example in examples) == sorted(LIMIT_NAMES)
    Limits.parse(",".join(examples))  # raises on a name or value it does not take
    said = re.search(r"`(%snapshot [^`]+)`", meaning[settings.BASELINE]).group(1)
    assert said.removeprefix("%snapshot ") in SNAPSHOT_USAGE
