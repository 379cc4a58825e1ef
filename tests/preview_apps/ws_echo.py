"""A WebSocket echo server (RFC 6455, text and binary frames, standard library only): each message a client
sends comes back as it was; a Close is answered with a Close.

Usage: python3 ws_echo.py PORT
"""

import base64
import hashlib
import socket
import struct
import sys
import threading

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def frame(opcode: int, payload: bytes) -> bytes:
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, size)
    elif size < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
    return head + payload


def serve(conn: socket.socket) -> None:
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Set-Cookie: boxcookie=from-the-websocket\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        try:
            while True:
                first, second = read_exactly(conn, 2)
                opcode, size = first & 0x0F, second & 0x7F
                if size == 126:
                    size = struct.unpack("!H", read_exactly(conn, 2))[0]
                elif size == 127:
                    size = struct.unpack("!Q", read_exactly(conn, 8))[0]
                mask = read_exactly(conn, 4) if second & 0x80 else b"\0\0\0\0"
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(read_exactly(conn, size)))
                if opcode == 0x8:
                    conn.sendall(frame(0x8, payload[:2]))
                    return
                if opcode == 0x9:
                    conn.sendall(frame(0xA, payload))
                elif opcode in (0x1, 0x2):
                    conn.sendall(frame(opcode, payload))
        except (ConnectionError, OSError):
            return


listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    client, _ = listener.accept()
    threading.Thread(target=serve, args=(client,), daemon=True).start()
