"""`%preview`'s pure parts, without a socket: what passes the proxy each way (owsandbox/preview/headers.py),
the tunnel's answers (tunnel.read_answer), the record of previewed ports, a container's door (the host's
record of how to reach its execd endpoint, and how the server finds it), and the magic's refusals
(which kernel id, which provider) with their words."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from owsandbox.host.providers import container_door as D
from owsandbox.host.providers.container import container_name
from owsandbox.kernel.errors import CellError
from owsandbox.kernel.magics import preview as M
from owsandbox.preview import headers as H
from owsandbox.preview import record
from owsandbox.preview.tunnel import TunnelRefused, read_answer, upgrade_request
from owsandbox.terminal import locate

pytestmark = pytest.mark.unit

PREFIX = "/owsandbox/preview/k/8000/~secret"


def test_the_servers_credentials_and_hop_by_hop_headers_never_go_to_the_box():
    sent = H.request_headers([("Cookie", "username-x=1"), ("Authorization", "token t"), ("X-XSRFToken", "x"),
                              ("Connection", "keep-alive, Cookie"), ("Host", "jupyter:8888"), ("Accept", "*/*"),
                              ("Sec-WebSocket-Key", "k"), ("Content-Length", "3"), ("Proxy-Authorization", "p")],
                             8000)
    assert sent == [("Host", "127.0.0.1:8000"), ("Accept", "*/*"), ("Connection", "close")]
    upgrade = H.request_headers([("Sec-WebSocket-Key", "k"), ("Sec-WebSocket-Version", "13"), ("Cookie", "c"),
                                 ("Upgrade", "websocket"), ("Origin", "null")], 8000, websocket=True)
    assert upgrade == [("Host", "127.0.0.1:8000"), ("Sec-WebSocket-Key", "k"), ("Sec-WebSocket-Version", "13"),
                       ("Origin", "null"), ("Connection", "Upgrade"), ("Upgrade", "websocket")]


@pytest.mark.parametrize("path, query, target", [
    ("/", "", "/"), ("", "", "/"), ("/a/b.html", "token=T&x=1&token=U", "/a/b.html?x=1"),
    ("/q", "a=1&b=&c=%20+", "/q?a=1&b=&c=%20+"), ("/t", "token=only", "/t"), ("/e", "tok%65n=T&z", "/e?z"),
])
def test_the_target_in_the_box_loses_only_the_token(path: str, query: str, target: str):
    assert H.request_target(path, query) == target


def test_the_boxs_answer_loses_its_cookies_and_gains_the_sandbox():
    got = H.response_headers([("Set-Cookie", "a=1"), ("set-cookie", "b=2"), ("Content-Type", "text/html"),
                              ("Transfer-Encoding", "chunked"), ("Referrer-Policy", "unsafe-url"),
                              ("Content-Security-Policy", "default-src 'self'")], PREFIX, 8000)
    names = [name.lower() for name, _ in got]
    assert "set-cookie" not in names and "transfer-encoding" not in names
    assert ("Content-Security-Policy", H.CSP) in got and ("Content-Security-Policy", "default-src 'self'") in got
    assert ("Referrer-Policy", "no-referrer") in got and ("Referrer-Policy", "unsafe-url") not in got
    assert ("Access-Control-Allow-Origin", "*") in got
    assert H.CSP == "sandbox allow-scripts allow-forms allow-popups; frame-ancestors 'self'"
    own = H.response_headers([("Access-Control-Allow-Origin", "null")], PREFIX, 8000)
    assert [v for n, v in own if n == "Access-Control-Allow-Origin"] == ["null"]


@pytest.mark.parametrize("location, moved", [
    ("/docs/", PREFIX + "/docs/"), ("http://127.0.0.1:8000/x?y=1", PREFIX + "/x?y=1"),
    ("http://localhost:8000", PREFIX + "/"), ("next.html", "next.html"), ("//evil.example/x", "//evil.example/x"),
    ("http://127.0.0.1:9000/x", "http://127.0.0.1:9000/x"), ("https://example.org/", "https://example.org/"),
])
def test_a_redirect_in_the_box_stays_under_the_preview(location: str, moved: str):
    assert H.location(location, PREFIX, 8000) == moved


def test_answer_heads_are_read_strictly():
    assert H.parse_answer_head(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket") == \
        (101, "Switching Protocols", [("Upgrade", "websocket")])
    for bad in (b"SSH-2.0-OpenSSH", b"HTTP/1.1 abc", b"HTTP/1.1 200 OK\r\nno colon", b"HTTP/1.1 200 OK\r\n X: y"):
        with pytest.raises(ValueError):
            H.parse_answer_head(bad)
    assert H.base_path("/user/ann/", "k", 80) == "/user/ann/owsandbox/preview/k/80"


def test_the_tunnels_refusals_carry_the_boxs_words():
    assert upgrade_request(8000, {"X-EXECD-ACCESS-TOKEN": "t"}).startswith(b"GET /ports/8000/tcp HTTP/1.1\r\n")
    read_answer(b"HTTP/1.1 101 Switching Protocols")
    with pytest.raises(TunnelRefused) as refused:
        read_answer(b"HTTP/1.1 502 Bad Gateway", b'{"code": "PORT_CLOSED", "message": "nothing listens on port 1"}')
    assert (refused.value.status, refused.value.code, str(refused.value)) == (502, "PORT_CLOSED",
                                                                              "nothing listens on port 1")
    with pytest.raises(TunnelRefused, match="not HTTP"):
        read_answer(b"garbage")


def test_the_record_keeps_ports_with_a_new_secret_each_time(tmp_path: Path):
    assert record.read(tmp_path) == {}
    record.add(tmp_path, 8000, "docs/")
    first = record.read(tmp_path)[8000]
    record.add(tmp_path, 8000, "docs/")
    second = record.read(tmp_path)[8000]
    assert first["path"] == "docs/" and len(first["secret"]) >= 32 and first["secret"] != second["secret"]
    assert (tmp_path / record.RECORD).stat().st_mode & 0o077 == 0
    assert record.remove(tmp_path, 8000) and not record.remove(tmp_path, 8000)
    (tmp_path / record.RECORD).write_text("{not json")
    with pytest.raises(RuntimeError, match="cannot be read"):
        record.read(tmp_path)


@pytest.mark.parametrize("connection_file, words", [
    (None, "no connection file"),
    ("/run/jupyter/kernel-3fd5d0a5-8b8f-47c5-bf52-6ecb33df5654_ab12cd34.json", "Enterprise Gateway"),
    ("/tmp/tmpab12cd.json", "not started by a Jupyter server"),
])
def test_a_kernel_no_jupyter_server_runs_is_told_why(connection_file: str | None, words: str):
    with pytest.raises(CellError, match=words):
        M.kernel_id(connection_file)


def test_the_kernel_id_is_the_servers():
    assert M.kernel_id("/r/kernel-3fd5d0a5-8b8f-47c5-bf52-6ecb33df5654.json") == "3fd5d0a5-8b8f-47c5-bf52-6ecb33df5654"


@pytest.mark.parametrize("provider, words", [
    ("local", "no network of its own"),
    ("exec", "this kernel's is exec"), ("opensandbox", "this kernel's is opensandbox"),
])
def test_providers_without_a_reachable_box_are_refused_loudly(provider: str, words: str):
    box = M.PreviewBox("/r/kernel-3fd5d0a5-8b8f-47c5-bf52-6ecb33df5654.json", SimpleNamespace(name=provider),
                       lambda: None, "/")
    with pytest.raises(CellError, match=words):
        M._state_dir(box)


def test_a_server_without_the_extension_is_named():
    box = M.PreviewBox("/r/kernel-x.json", SimpleNamespace(name="bwrap"), lambda: None, "")
    with pytest.raises(CellError, match="has not loaded the owsandbox.preview extension"):
        M._base_url(box)


def test_the_frame_is_sandboxed_without_same_origin():
    page = M.page("/owsandbox/preview/k/8000/", 8000)["text/html"]
    assert 'sandbox="allow-scripts allow-forms allow-popups"' in page and "allow-same-origin" not in page
    assert 'rel="noopener noreferrer"' in page


KEY = "kernel-3fd5d0a5-8b8f-47c5-bf52-6ecb33df5654"
TOKEN = "t0ken-of-the-box-daemon_123"


def _container_folder(runtime: Path, engine: str = "podman-0123456789ab") -> Path:
    folder = runtime / engine / container_name(os.getuid(), KEY)
    folder.mkdir(parents=True, mode=0o700)
    for made in (runtime, runtime / engine):
        made.chmod(0o700)
    return folder


def _door(folder: Path, **changed: object) -> D.ContainerDoor:
    door = D.ContainerDoor("/usr/bin/podman", folder.name, "/usr/bin/python3", "/run/owsandbox/runner-1.pyz",
                           "/run/owsandbox/k/run/execd.sock", TOKEN, {"CONTAINERS_CONF": "/etc/c.conf"})
    D.write(folder, door)
    if changed:
        data = json.loads((folder / D.RECORD).read_text())
        data.update(changed)
        (folder / D.RECORD).write_text(json.dumps(data))
    return door


def test_a_containers_door_is_the_engines_exec_of_the_forward_relay_with_the_kernels_engine_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(D.os, "access", lambda path, mode: path == "/usr/bin/podman")
    folder = _container_folder(tmp_path)
    written = _door(folder)
    door = D.read(folder)
    assert door == written
    assert door.argv() == ["/usr/bin/podman", "exec", "-i", folder.name, "/usr/bin/python3", "-S",
                           "/run/owsandbox/runner-1.pyz", "forward", "--socket", "/run/owsandbox/k/run/execd.sock"]
    assert door.headers == {"X-EXECD-ACCESS-TOKEN": TOKEN}
    # The server's own engine settings give way to the kernel's: the same engine, daemon and store.
    env = door.env({"PATH": "/usr/bin", "DOCKER_HOST": "unix:///elsewhere", "CONTAINERS_CONF": "/other"})
    assert env == {"PATH": "/usr/bin", "CONTAINERS_CONF": "/etc/c.conf"}
    assert TOKEN not in repr(door)


@pytest.mark.parametrize("changed, words", [
    ({"engine": "podman"}, "names no engine"), ({"engine": "/usr/bin/sh"}, "names no engine"),
    ({"engine": "/gone/docker"}, "no longer a program here"),
    ({"engine_env": {"LD_PRELOAD": "/x.so"}}, "other than the engine's own"),
    ({"container": "owsandbox-0-kernel-another"}, "not owsandbox-"),
    ({"runner": "/run/x; rm -rf /"}, "plain words"), ({"socket": ["/a"]}, "plain words"),
    ({"execd_token": "short"}, "no execd token"), ({"execd_token": None}, "no execd token"),
])
def test_a_containers_door_that_cannot_be_trusted_is_refused_with_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         changed: dict[str, object], words: str):
    monkeypatch.setattr(D.os, "access", lambda path, mode: path in ("/usr/bin/podman", "/usr/bin/sh"))
    folder = _container_folder(tmp_path)
    _door(folder, **changed)
    with pytest.raises(D.DoorRefused, match=words):
        D.read(folder)


def test_a_container_that_has_not_said_its_door_yet_is_named(tmp_path: Path):
    folder = _container_folder(tmp_path)
    with pytest.raises(locate.NoSandbox, match="has not said yet how to reach it"):
        locate.door_in(folder)
    (folder / D.RECORD).write_text("[1]")
    with pytest.raises(locate.NoSandbox, match="not a record of a container's door"):
        locate.door_in(folder)


def test_the_server_finds_a_containers_state_folder_by_the_kernels_key_in_its_engines_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(locate, "_private_problem", _private_problem_under(tmp_path))
    import owsandbox.host.privatedir as privatedir

    monkeypatch.setattr(privatedir, "runtime_candidates", lambda: [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(locate.NoSandbox, match="no sandbox state for " + KEY):
        locate.state_folder(KEY)
    podman = _container_folder(tmp_path / "b", "podman-0123456789ab")
    (tmp_path / "a").mkdir(mode=0o700)
    assert locate.state_folder(KEY) == podman
    # Two engines' boxes with one key (a podman and a Docker kernel): the one renewed last.
    docker = _container_folder(tmp_path / "a", "docker-ba9876543210")
    for folder, when in ((podman, 1000), (docker, 2000)):
        (folder / "lease").touch()
        os.utime(folder / "lease", (when, when))
    assert locate.state_folder(KEY) == docker
    os.utime(podman / "lease", (3000, 3000))
    assert locate.state_folder(KEY) == podman
    # Folders not named as an engine's are not looked in; a bwrap box's folder of the key comes first.
    _container_folder(tmp_path / "a", "elsewhere")
    (tmp_path / "a" / KEY).mkdir(mode=0o700)
    assert locate.state_folder(KEY) == tmp_path / "a" / KEY
    # An engine folder open to others is passed over, and said.
    (tmp_path / "a" / KEY).rmdir()
    podman.parent.chmod(0o755)
    assert locate.state_folder(KEY) == docker
    docker.parent.chmod(0o755)
    with pytest.raises(locate.NoSandbox, match="open to other users"):
        locate.state_folder(KEY)


def _private_problem_under(root: Path):  # type: ignore[no-untyped-def]
    """locate's check, for folders under `root` only (the tests' own)."""
    check = locate._private_problem

    def problem(path: Path) -> str | None:
        assert str(path).startswith(str(root)), path
        return check(path)
    return problem


def test_a_terminal_for_a_containers_kernel_says_it_is_a_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import owsandbox.host.privatedir as privatedir

    monkeypatch.setattr(privatedir, "runtime_candidates", lambda: [tmp_path])
    folder = _container_folder(tmp_path, "docker-ba9876543210")
    with pytest.raises(locate.NoSandbox, match=f"is a container \\(docker\\).*docker exec -it {folder.name} bash"):
        locate.sandbox_of(Path(f"/r/{KEY}.json"))


@pytest.mark.parametrize("engine", ["podman", "docker"])
def test_the_server_looks_in_the_folders_the_container_provider_makes(tmp_path: Path, engine: str):
    from owsandbox.host.providers.container import ContainerProvider

    provider = ContainerProvider(tmp_path, image="localhost/x:1", engine=engine, key=KEY)
    provider.engine = f"/usr/bin/{engine}"  # as _use_engine finds it (no engine is run here)
    assert locate._ENGINE_FOLDER.fullmatch(provider.engine_folder_name())
    assert provider.container == container_name(os.getuid(), KEY)
