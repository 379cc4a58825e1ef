"""The kernelspec: what `owsandbox install` writes and where, `uninstall`, and the copy `pip install` ships.

Every test points Jupyter's search path and data dir at a temporary folder, so nothing outside it is
installed or removed, and no kernel is started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from owsandbox import kernelspec
from owsandbox.kernelspec import DISPLAY_NAME, KERNEL_BOOT, KERNEL_NAME, LOGOS, RESOURCES, kernel_dict

ROOT = Path(__file__).resolve().parent.parent
STATIC_SPEC = ROOT / "share" / "jupyter" / "kernels" / KERNEL_NAME


@pytest.fixture
def jupyter_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Jupyter's user dirs and search path confined to tmp_path; `prefix` is on JUPYTER_PATH."""
    pytest.importorskip("jupyter_client")
    dirs = {"home": tmp_path / "home", "data": tmp_path / "data", "prefix": tmp_path / "prefix"}
    for folder in dirs.values():
        folder.mkdir()
    monkeypatch.setenv("HOME", str(dirs["home"]))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(dirs["data"]))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("JUPYTER_PATH", str(dirs["prefix"] / "share" / "jupyter"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("JUPYTER_PLATFORM_DIRS", raising=False)
    return dirs


def read_spec(folder: Path | str) -> dict:
    return json.loads((Path(folder) / "kernel.json").read_text(encoding="utf-8"))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "owsandbox.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.unit
def test_kernel_dict_defaults_and_env() -> None:
    spec = kernel_dict()
    assert spec == {
        "argv": ["python", "-c", KERNEL_BOOT, "-f", "{connection_file}"],
        "display_name": DISPLAY_NAME,
        "language": "bash",
        "interrupt_mode": "message",
        "metadata": {"owsandbox": {"provider": "auto"}, "debugger": False},
    }
    spec = kernel_dict(provider="exec", env={"OWSANDBOX_EXEC": "ssh me@host"}, display_name="X", executable="/py")
    assert spec["argv"][0] == "/py"
    assert spec["display_name"] == "X"
    assert spec["env"] == {"OWSANDBOX_EXEC": "ssh me@host", "OWSANDBOX_PROVIDER": "exec"}
    assert spec["metadata"]["owsandbox"]["provider"] == "exec"
    # the provider argument wins over one in env; one only in env still shows in the metadata
    assert kernel_dict(provider="a", env={"OWSANDBOX_PROVIDER": "b"})["env"]["OWSANDBOX_PROVIDER"] == "a"
    assert kernel_dict(env={"OWSANDBOX_PROVIDER": "b"})["metadata"]["owsandbox"]["provider"] == "b"


@pytest.mark.unit
def test_install_prefix(jupyter_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    prefix = jupyter_dirs["prefix"]
    assert kernelspec.main(["install", "--prefix", str(prefix)]) == 0
    dest = prefix / "share" / "jupyter" / "kernels" / KERNEL_NAME
    assert capsys.readouterr().out.strip() == f"Installed kernelspec {KERNEL_NAME} in {dest}"
    spec = read_spec(dest)
    assert spec == kernel_dict(executable=sys.executable)
    assert spec["argv"][0] == sys.executable and os.path.isabs(spec["argv"][0])
    assert spec["interrupt_mode"] == "message"
    assert spec["metadata"]["owsandbox"] == {"provider": "auto"}
    assert "env" not in spec
    for logo in LOGOS:
        assert (dest / logo).read_bytes() == (RESOURCES / logo).read_bytes()

    from jupyter_client.kernelspec import KernelSpecManager

    found = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    assert found.language == "bash" and found.interrupt_mode == "message" and found.display_name == DISPLAY_NAME
    assert found.resource_dir == str(dest)


def test_install_named_with_provider_and_env_through_the_cli(jupyter_dirs: dict[str, Path]) -> None:
    prefix = jupyter_dirs["prefix"]
    done = run_cli("install", "--prefix", str(prefix), "--name", "box-ssh", "--display-name", "Sandbox (ssh box)",
                   "--provider", "exec", "--env", "OWSANDBOX_EXEC=ssh me@host")
    assert done.returncode == 0, done.stderr
    dest = prefix / "share" / "jupyter" / "kernels" / "box-ssh"
    assert done.stdout.strip() == f"Installed kernelspec box-ssh in {dest}"
    spec = read_spec(dest)
    assert spec["display_name"] == "Sandbox (ssh box)"
    assert spec["env"] == {"OWSANDBOX_EXEC": "ssh me@host", "OWSANDBOX_PROVIDER": "exec"}
    assert spec["metadata"]["owsandbox"]["provider"] == "exec"
    assert spec["argv"][0] == sys.executable

    from jupyter_client.kernelspec import KernelSpecManager

    assert KernelSpecManager().get_kernel_spec("box-ssh").env == spec["env"]


@pytest.mark.unit
def test_env_forms(jupyter_dirs: dict[str, Path]) -> None:
    prefix = str(jupyter_dirs["prefix"])
    assert kernelspec.main(["install", "--prefix", prefix, "--name", "many",
                            "--env", "A=1", "B=x=y", "--env", "C=", "--name", "many"]) == 0
    spec = read_spec(Path(prefix) / "share" / "jupyter" / "kernels" / "many")
    # Variables given to the kernelspec are for the cells: their names pass into the sandbox's clean env.
    assert spec["env"] == {"A": "1", "B": "x=y", "C": "", "OWSANDBOX_ENV": "A,B,C"}
    assert spec["display_name"] == f"{DISPLAY_NAME} [many]"  # another name, no display name given


@pytest.mark.unit
def test_limits_are_checked_at_install_and_kept_in_the_spec(jupyter_dirs: dict[str, Path], capsys) -> None:
    prefix = str(jupyter_dirs["prefix"])
    assert kernelspec.main(["install", "--prefix", prefix, "--name", "small", "--limit", "memory=2G",
                            "--limit", "pids=512", "--env", "OWSANDBOX_NETWORK=1"]) == 0
    spec = read_spec(Path(prefix) / "share" / "jupyter" / "kernels" / "small")
    assert spec["env"] == {"OWSANDBOX_NETWORK": "1", "OWSANDBOX_LIMITS": "memory=2G,pids=512"}
    assert kernelspec.main(["install", "--prefix", prefix, "--name", "bad", "--limit", "memory=lots"]) == 2
    assert "limit memory='lots' is not a size" in capsys.readouterr().err
    assert not (Path(prefix) / "share" / "jupyter" / "kernels" / "bad").exists()


@pytest.mark.unit
def test_a_setting_the_kernel_would_refuse_is_refused_at_install(jupyter_dirs: dict[str, Path], capsys) -> None:
    prefix = str(jupyter_dirs["prefix"])
    assert kernelspec.main(["install", "--prefix", prefix, "--name", "bad", "--env", "OWSANDBOX_NETWORK=maybe"]) == 2
    assert "OWSANDBOX_NETWORK='maybe' is neither 1 (yes, true, on) nor 0" in capsys.readouterr().err
    assert not (Path(prefix) / "share" / "jupyter" / "kernels" / "bad").exists()


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["NOEQUALS", "=value"])
def test_bad_env_is_an_argparse_error(jupyter_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                      bad: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        kernelspec.main(["install", "--prefix", str(jupyter_dirs["prefix"]), "--env", bad])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --env" in err and repr(bad) in err and "KEY=VALUE" in err
    assert not (jupyter_dirs["prefix"] / "share").exists()


@pytest.mark.unit
def test_install_user_with_jupyter_data_dir(jupyter_dirs: dict[str, Path]) -> None:
    assert kernelspec.main(["install", "--user", "--name", "mine"]) == 0
    assert read_spec(jupyter_dirs["data"] / "kernels" / "mine")["argv"][0] == sys.executable


def test_install_user_with_home(jupyter_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUPYTER_DATA_DIR")
    done = run_cli("install", "--user")
    assert done.returncode == 0, done.stderr
    dest = jupyter_dirs["home"] / ".local" / "share" / "jupyter" / "kernels" / KERNEL_NAME
    assert done.stdout.strip() == f"Installed kernelspec {KERNEL_NAME} in {dest}"
    assert read_spec(dest)["display_name"] == DISPLAY_NAME


@pytest.mark.unit
def test_sys_prefix_is_prefix_of_this_python(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--sys-prefix means prefix=sys.prefix (sys.prefix is pointed at tmp_path so nothing real changes)."""
    pytest.importorskip("jupyter_client")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    dest = kernelspec.install(sys_prefix=True, name="sp")
    assert Path(dest) == tmp_path / "share" / "jupyter" / "kernels" / "sp"
    assert (Path(dest) / "kernel.json").is_file()


@pytest.mark.unit
def test_user_and_prefix_conflict(jupyter_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    prefix = str(jupyter_dirs["prefix"])
    with pytest.raises(ValueError, match="both user and prefix"):
        kernelspec.install(user=True, prefix=prefix)
    with pytest.raises(ValueError, match="both user and sys_prefix"):
        kernelspec.install(user=True, sys_prefix=True)
    with pytest.raises(ValueError, match="both prefix and sys_prefix"):
        kernelspec.install(prefix=prefix, sys_prefix=True)
    for flags in (["--user", "--prefix", prefix], ["--user", "--sys-prefix"], ["--sys-prefix", "--prefix", prefix]):
        with pytest.raises(SystemExit) as exit_info:
            kernelspec.main(["install", *flags])
        assert exit_info.value.code == 2
        assert "not allowed with argument" in capsys.readouterr().err
    assert not (jupyter_dirs["data"] / "kernels").exists()


@pytest.mark.unit
def test_invalid_name(jupyter_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert kernelspec.main(["install", "--prefix", str(jupyter_dirs["prefix"]), "--name", "no spaces!"]) == 2
    assert "Invalid kernel name" in capsys.readouterr().err


@pytest.mark.unit
def test_uninstall(jupyter_dirs: dict[str, Path]) -> None:
    prefix = str(jupyter_dirs["prefix"])
    kept = kernelspec.install(prefix=prefix, name="owsandbox-test-kept")
    dest = kernelspec.install(prefix=prefix, name="owsandbox-test-gone")
    assert kernelspec.uninstall("owsandbox-test-gone") == dest
    assert not Path(dest).exists() and Path(kept).exists()

    with pytest.raises(KeyError) as error:
        kernelspec.uninstall("owsandbox-test-gone")
    message = str(error.value)
    assert "No kernelspec named 'owsandbox-test-gone'" in message
    assert f"owsandbox-test-kept ({kept})" in message


def test_uninstall_through_the_cli(jupyter_dirs: dict[str, Path]) -> None:
    dest = kernelspec.install(user=True, name="owsandbox-test-cli")
    done = run_cli("uninstall", "--name", "owsandbox-test-cli")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"Removed kernelspec owsandbox-test-cli from {dest}"
    assert not Path(dest).exists()

    done = run_cli("uninstall", "--name", "owsandbox-test-cli")
    assert done.returncode == 1
    assert "No kernelspec named 'owsandbox-test-cli' is installed" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_keeps_other_commands() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")}
    assert {"tour", "run", "shell", "replay", "install", "uninstall", "settings", "runner"} <= listed, done.stdout
    assert all(len(line.split(maxsplit=2)) >= 2 for line in done.stdout.splitlines() if line.startswith("  "))
    done = run_cli("install", "--help")
    assert done.returncode == 0 and "usage: owsandbox install" in done.stdout and "--sys-prefix" in done.stdout
    assert run_cli("nope").returncode == 2


@pytest.mark.unit
def test_static_spec_matches_kernel_dict() -> None:
    assert read_spec(STATIC_SPEC) == kernel_dict()
    for logo in LOGOS:
        assert (STATIC_SPEC / logo).read_bytes() == (RESOURCES / logo).read_bytes()
    assert sorted(p.name for p in STATIC_SPEC.iterdir()) == sorted(["kernel.json", *LOGOS])


@pytest.mark.unit
def test_static_spec_launches_this_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """jupyter_client swaps the bare "python" of the shipped spec for the interpreter launching the kernel."""
    pytest.importorskip("jupyter_client")
    monkeypatch.setenv("JUPYTER_PATH", str(ROOT / "share" / "jupyter"))
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name=KERNEL_NAME)
    assert manager.kernel_spec.resource_dir == str(STATIC_SPEC)
    cmd = manager.format_kernel_cmd()
    assert cmd[:3] == [sys.executable, "-c", KERNEL_BOOT]


def test_wheel_ships_the_kernelspec(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="building the wheel offline needs hatchling in this environment")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = tmp_path.glob("owsandbox-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (data,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".data")}
        shared = f"{data}/data/share/jupyter/kernels/{KERNEL_NAME}"
        assert json.loads(archive.read(f"{shared}/kernel.json")) == kernel_dict()
        for logo in LOGOS:
            assert archive.read(f"{shared}/{logo}") == (RESOURCES / logo).read_bytes()
            assert f"owsandbox/kernelspec/resources/{logo}" in names
