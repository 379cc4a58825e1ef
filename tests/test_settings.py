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


# -- the grammar: one per kind, the same for every reader ------------------------------------------------

@pytest.mark.parametrize("text", ["1", "true", "True", "TRUE", "yes", "Yes", "on", "ON", " 1 "])
def test_a_switch_is_on_for_each_word_of_yes(text: str) -> None:
    assert settings.Settings.from_env({settings.NETWORK: text}).network is True


@pytest.mark.parametrize("text", ["0", "false", "False", "no", "NO", "off", "Off", "", "  "])
def test_a_switch_is_off_for_each_word_of_no_and_for_nothing(text: str) -> None:
    assert settings.Settings.from_env({settings.NETWORK: text}).network is False
    assert settings.Settings.from_env({}).network is False


@pytest.mark.parametrize("text", ["maybe", "2", "y", "enabled", "-1"])
def test_any_other_switch_value_is_an_error_naming_the_variable_the_value_and_what_it_takes(text: str) -> None:
    with pytest.raises(settings.SettingsError) as raised:
        settings.Settings.from_env({settings.WRITABLE_ROOT: text})
    message = str(raised.value)
    assert message.startswith(f"OWSANDBOX_WRITABLE_ROOT={text!r} is neither 1") and "nor 0" in message
    assert raised.value.name == settings.WRITABLE_ROOT and isinstance(raised.value, ValueError)


def test_network_true_means_on_for_every_provider_that_has_a_network_switch(tmp_path) -> None:
    """`OWSANDBOX_NETWORK=True` once turned the network on for a container and left it off for
    bubblewrap: each parsed the switch its own way. Now both read the same Settings."""
    from owsandbox.host.providers.bwrap import BwrapProvider
    from owsandbox.host.providers.container import ContainerProvider

    for text, meant in (("True", True), ("on", True), ("YES", True), ("False", False), ("off", False)):
        given = settings.Settings.from_env({settings.NETWORK: text, settings.IMAGE: "debian"})
        assert BwrapProvider(tmp_path, settings=given).network is meant, text
        assert ContainerProvider(tmp_path, settings=given).network is meant, text
    with pytest.raises(settings.SettingsError, match="OWSANDBOX_NETWORK='maybe'"):
        BwrapProvider(tmp_path, settings=settings.settings_of({settings.NETWORK: "maybe"}))
    assert BwrapProvider(tmp_path, network=False, settings=settings.settings_of({settings.NETWORK: "maybe"}))


def test_a_number_takes_decimals_and_refuses_words_infinity_and_values_under_its_least() -> None:
    parsed = settings.Settings.from_env({settings.LINGER: "2.5", settings.OUTPUT_RATE: "0",
                                         settings.OPENSANDBOX_TIMEOUT: " 600 "})
    assert (parsed.linger, parsed.output_rate, parsed.opensandbox_timeout) == (2.5, 0.0, 600.0)
    assert settings.Settings.from_env({settings.LINGER: ""}).linger is None  # not set: the reader's default
    for text in ("soon", "-1", "nan", "1e", "inf", "Infinity", "1e999"):
        with pytest.raises(settings.SettingsError, match=f"^OWSANDBOX_LINGER={text!r} is not a number of seconds"):
            settings.Settings.from_env({settings.LINGER: text})


def test_a_size_is_bytes_with_the_units_the_limits_take() -> None:
    from owsandbox.host.isolation.resources import parse_size

    for text, size in (("500M", 500 << 20), ("8G", 8 << 30), ("1.5G", int(1.5 * (1 << 30))), ("2KiB", 2048),
                       ("1048576", 1 << 20), ("4 gb", 4 << 30)):
        assert settings.Settings.from_env({settings.SNAPSHOT_LIMIT: text}).snapshot_limit == size
        assert parse_size(text, "memory") == size  # the limits' grammar is the same one
    with pytest.raises(settings.SettingsError, match=r"^OWSANDBOX_RECORD_LIMIT='lots' is not a size \(examples"):
        settings.Settings.from_env({settings.RECORD_LIMIT: "lots"})


def test_a_list_is_comma_separated_each_item_stripped_and_empty_items_left_out() -> None:
    parsed = settings.Settings.from_env({settings.ENV: " A, B ,,C,", settings.LIMITS: "memory=1G, pids=64"})
    assert parsed.env == ("A", "B", "C") and parsed.limits == ("memory=1G", "pids=64")
    assert settings.Settings.from_env({}).writable == ()


def test_text_is_stripped_and_an_unset_variable_is_its_default() -> None:
    parsed = settings.Settings.from_env({settings.IMAGE: "  debian:12 \n", settings.PROVIDER: "bwrap"})
    assert parsed.image == "debian:12" and parsed.provider == "bwrap" and parsed.engine == ""
    assert settings.Settings.from_env({"OWSANDBOX_UNKNOWN": "x", "PATH": "/bin"}) == settings.Settings()


def test_every_invalid_setting_is_named_at_once() -> None:
    env = {settings.NETWORK: "perhaps", settings.OUTPUT_RATE: "fast", settings.IMAGE: "fine"}
    with pytest.raises(settings.SettingsError) as raised:
        settings.Settings.from_env(env)
    assert "OWSANDBOX_NETWORK='perhaps'" in str(raised.value) and "OWSANDBOX_OUTPUT_RATE='fast'" in str(raised.value)
    assert [error.name for error in settings.problems(env)] == [settings.NETWORK, settings.OUTPUT_RATE]


def test_read_leniently_an_invalid_setting_is_an_error_only_where_it_is_read() -> None:
    lenient = settings.settings_of({settings.NETWORK: "perhaps", settings.IMAGE: "debian"})
    assert lenient.image == "debian"
    with pytest.raises(settings.SettingsError, match="OWSANDBOX_NETWORK='perhaps' is neither"):
        _ = lenient.network
    assert "perhaps" in repr(lenient)
    assert settings.read(settings.LINGER, {settings.LINGER: "3", settings.NETWORK: "perhaps"}) == 3.0
    assert settings.read(settings.NETWORK, {}) is False
    assert settings.settings_of(lenient) is lenient


def test_a_secret_is_never_in_the_settings_repr() -> None:
    shown = repr(settings.Settings.from_env({settings.EXECD_TOKEN: "s3cret", settings.OPENSANDBOX_API_KEY: "k3y"}))
    assert "s3cret" not in shown and "k3y" not in shown and "execd_token='...'" in shown


def test_the_settings_object_and_the_list_come_from_the_same_definitions() -> None:
    from dataclasses import fields

    described = settings.describe()
    assert [field.name for field in fields(settings.Settings)] == [setting.field for setting in described]
    assert {setting.kind for setting in described} == {"text", "switch", "number", "size", "list", "limits"}
    assert all(setting.takes for setting in described)
    kinds = {setting.name: setting.kind for setting in described}
    assert kinds[settings.NETWORK] == kinds[settings.WRITABLE_ROOT] == kinds[settings.OPENSANDBOX_SERVER_PROXY] \
        == "switch"
    assert {name for name, kind in kinds.items() if kind == "size"} == {settings.SNAPSHOT_LIMIT, settings.RECORD_LIMIT}


def test_owsandbox_settings_names_an_invalid_setting_and_fails(capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.NETWORK, "perhaps")
    monkeypatch.setenv(settings.IMAGE, "debian")
    assert cli.main(["settings"]) == 1
    captured = capsys.readouterr()
    assert f"{settings.NETWORK}=perhaps\n" in captured.out and f"{settings.IMAGE}=debian\n" in captured.out
    assert "INVALID: OWSANDBOX_NETWORK takes 1 (yes, true, on) or 0" in captured.out
    assert "OWSANDBOX_NETWORK='perhaps' is neither 1" in captured.err


def test_the_kernels_sandbox_says_an_invalid_setting_to_every_cell_instead_of_starting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from owsandbox.kernel.sandbox import Sandbox, SandboxUnavailable

    monkeypatch.setenv(settings.NETWORK, "maybe")
    sandbox = Sandbox(provider="local")
    for _ in range(2):
        with pytest.raises(SandboxUnavailable, match="cannot start: OWSANDBOX_NETWORK='maybe' is neither 1"):
            sandbox.wait(0.1)
    assert sandbox.settings == settings.Settings()  # the kernel's other parts run on the defaults meanwhile


# -- the limits: a name of no limit is refused where the setting is read, whatever the provider ----------

@pytest.mark.parametrize(("text", "word", "meant"), [
    ("processes=5", "processes", "pids"),  # the word %sandbox shows for pids
    ("memory=1G, memroy=2G", "memroy", "memory"),  # a close spelling
    ("/tmp=1G", "/tmp", "tmp"),
    ("pids=64,cpus=2", "cpus", "cpu"),
    ("swap=1G", "swap", None),  # nothing close: the names alone
])
def test_a_limit_of_no_such_name_is_refused_naming_the_variable_the_word_and_the_limits(
        text: str, word: str, meant: str | None) -> None:
    with pytest.raises(settings.SettingsError) as raised:
        settings.Settings.from_env({settings.LIMITS: text})
    said = str(raised.value)
    assert said.startswith(f"OWSANDBOX_LIMITS={text!r}: no limit is named {word!r}"), said
    assert said.endswith("; the limits are memory, pids, tmp, shm, cpu"), said
    assert (f"(did you mean {meant}?)" in said) if meant else "did you mean" not in said, said
    assert raised.value.name == settings.LIMITS
    assert [error.name for error in settings.problems({settings.LIMITS: text})] == [settings.LIMITS]


def test_a_limit_without_a_value_is_refused_and_known_names_pass_in_any_case() -> None:
    with pytest.raises(settings.SettingsError, match=r"^OWSANDBOX_LIMITS='pids': 'pids' is not NAME=VALUE"):
        settings.Settings.from_env({settings.LIMITS: "pids"})
    parsed = settings.Settings.from_env({settings.LIMITS: "Memory=1G, PIDS=64, tmp=1G, shm=64M, cpu=1"})
    assert parsed.limits == ("Memory=1G", "PIDS=64", "tmp=1G", "shm=64M", "cpu=1")
    assert settings.Settings.from_env({settings.LIMITS: ""}).limits == ()


def test_a_wrong_limit_name_is_the_same_error_from_install_and_from_the_settings() -> None:
    """`owsandbox install --limit` (the limits' own parse) says what the setting says."""
    from owsandbox.host.isolation.resources import Limits

    with pytest.raises(ValueError, match=r"^limit 'processes=5': no limit is named 'processes' "
                                         r"\(did you mean pids\?\); the limits are memory, pids, tmp, shm, cpu$"):
        Limits.parse(["processes=5"])


def test_a_wrong_limit_name_stops_even_a_sandbox_without_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local provider enforces no limits and never reads them: the name is still refused, said to
    every cell, never quietly no limit at all; read leniently, it is an error where it is read."""
    from owsandbox.kernel.sandbox import Sandbox, SandboxUnavailable

    monkeypatch.setenv(settings.LIMITS, "processes=5")
    sandbox = Sandbox(provider="local")
    with pytest.raises(SandboxUnavailable, match=r"cannot start: OWSANDBOX_LIMITS='processes=5': no limit is named "
                                                 r"'processes' \(did you mean pids\?\)"):
        sandbox.wait(0.1)
    lenient = settings.settings_of({settings.LIMITS: "processes=5"})
    with pytest.raises(settings.SettingsError, match="did you mean pids"):
        lenient.limits  # noqa: B018 - reading it is the test


def test_owsandbox_settings_fails_on_a_wrong_limit_name(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.LIMITS, "processes=5")
    assert cli.main(["settings"]) == 1
    captured = capsys.readouterr()
    assert "INVALID: OWSANDBOX_LIMITS takes a list of NAME=VALUE, NAME one of memory, pids, tmp, shm, cpu" \
        in captured.out, captured.out
    assert "no limit is named 'processes' (did you mean pids?)" in captured.err
