#!/usr/bin/env python3
"""The Redis check-and-count script alone: redis-server's CPU per call.

Starts a private redis-server on a free loopback port, loads SCRIPT (default: the
repository's check_and_count.lua), fills KEYS counters, then sends batches of calls
(one sliding window of a second, precision 10, every call admitted) over one
connection, eight batches in flight, and prints redis-server's CPU (from /proc) per
call and Redis' own time per call (INFO commandstats), and the memory per key.

    scripts/redis-script-cost.py [--script FILE] [--keys 10000] [--calls 200000]
                                 [--batch 16] [--prefill FILE] [--key-format F]
                                 [--server BIN]

--prefill runs the filling calls with another script (to time a cut-down variant on
counters the full script wrote). --server runs another server binary that takes
redis-server's arguments (valkey-server, to compare). Used for the figures in
docs/BENCHMARKS.md.
"""
import argparse, os, random, socket, struct, subprocess, time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, '..', 'crates', 'tollgate-core', 'src', 'store', 'redis', 'check_and_count.lua')


def command(*args):
    out = b'*%d\r\n' % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else str(a).encode() if isinstance(a, int) else a
        out += b'$%d\r\n%s\r\n' % (len(a), a)
    return out


class Connection:
    """RESP over one socket: enough for EVALSHA, INFO and SCRIPT LOAD."""

    def __init__(self, port):
        self.sock = socket.create_connection(('127.0.0.1', port))
        self.buf = b''

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError('redis-server closed the connection')
            self.buf += chunk

    def _line(self):
        while b'\r\n' not in self.buf:
            self._fill(len(self.buf) + 1)
        i = self.buf.index(b'\r\n')
        line, self.buf = self.buf[:i], self.buf[i + 2:]
        return line

    def read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b'+':
            return rest
        if kind == b'-':
            raise RuntimeError(rest.decode())
        if kind == b':':
            return int(rest)
        if kind == b'$':
            n = int(rest)
            if n < 0:
                return None
            self._fill(n + 2)
            value, self.buf = self.buf[:n], self.buf[n + 2:]
            return value
        if kind == b'*':
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError('unexpected reply %r' % line)

    def call(self, *args):
        self.send(command(*args))
        return self.read()


def number(n):
    """n in MessagePack's shortest unsigned form, as script.rs writes it."""
    if n < 0x80:
        return bytes([n])
    if n < 0x100:
        return b'\xcc' + bytes([n])
    if n < 0x10000:
        return b'\xcd' + struct.pack('>H', n)
    if n < 0x100000000:
        return b'\xce' + struct.pack('>I', n)
    return b'\xcf' + struct.pack('>Q', n)


def consume_one():
    """Mode 'c', one hit, no debt, no deadline, Redis' clock; one sliding window of a
    second, precision 10, a billion per second."""
    head = b'\xa1c' + number(1) + number(0) * 4
    return head + b'\xa1s' + number(1_000_000) + number(10) + number(1_000_000_000)


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


def info(conn, section, field):
    text = conn.call('INFO', section).decode()
    return [line.split(':', 1)[1] for line in text.splitlines() if line.startswith(field)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--script', default=SCRIPT)
    p.add_argument('--prefill')
    p.add_argument('--keys', type=int, default=10_000)
    p.add_argument('--calls', type=int, default=200_000)
    p.add_argument('--batch', type=int, default=16)
    p.add_argument('--key-format', default='{load|user=user_%d#s1000000000.10}:v3')
    p.add_argument('--server', default='redis-server')
    a = p.parse_args()
    port = free_port()
    server = subprocess.Popen([a.server, '--port', str(port), '--bind', '127.0.0.1',
                               '--save', '', '--appendonly', 'no'], stdout=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                conn = Connection(port)
                conn.call('PING')
                break
            except OSError:
                time.sleep(0.05)
        used_before = int(info(conn, 'memory', 'used_memory:')[0])
        arg = consume_one()
        rnd = random.Random(1)

        def run(sha, batches):
            out = sent = done = 0
            while done < batches:
                while out < 8 and sent < batches:
                    keys = [a.key_format % rnd.randrange(a.keys) for _ in range(a.batch)]
                    conn.send(command('EVALSHA', sha, a.batch, *keys, *([arg] * a.batch)))
                    out += 1
                    sent += 1
                conn.read()
                out -= 1
                done += 1

        fill = conn.call('SCRIPT', 'LOAD', open(a.prefill or a.script).read())
        run(fill, 2 * a.keys // a.batch + 1)
        sha = conn.call('SCRIPT', 'LOAD', open(a.script).read())
        conn.call('CONFIG', 'RESETSTAT')

        def cpu():
            fields = open('/proc/%d/stat' % server.pid).read().rsplit(')', 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')

        batches = a.calls // a.batch
        calls = batches * a.batch
        cpu0, t0 = cpu(), time.time()
        run(sha, batches)
        cpu1, t1 = cpu(), time.time()
        stats = dict(kv.split('=') for kv in info(conn, 'commandstats', 'cmdstat_evalsha:')[0].split(','))
        used = int(info(conn, 'memory', 'used_memory:')[0])
        keys = conn.call('DBSIZE')
        print('%s: %s CPU %.2f us per call; inside EVALSHA %.2f us per call; '
              '%.0f calls/s; %d keys, %.0f B each' % (
                  os.path.basename(a.script), os.path.basename(a.server),
                  (cpu1 - cpu0) * 1e6 / calls,
                  int(stats['usec']) / calls, calls / (t1 - t0), keys,
                  (used - used_before) / max(keys, 1)))
    finally:
        server.kill()
        server.wait()


if __name__ == '__main__':
    main()
