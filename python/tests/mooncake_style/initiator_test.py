"""An initiator test written for Mooncake Transfer Engine (unittest, `mooncake.engine`), run
unchanged against connex_c by tests/test_mooncake.py: the peer's first buffer comes from
get_first_buffer_address, data goes both ways through every transfer style."""

import os
import random
import time
import unittest

from mooncake.engine import TransferEngine, TransferOpcode


class TestInitiator(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.target = os.getenv("TARGET_SERVER_NAME", "127.0.0.1:12345")
        cls.engine = TransferEngine()
        rc = cls.engine.initialize(os.getenv("INITIATOR_SERVER_NAME", "127.0.0.1:12347"),
                                   os.getenv("MC_METADATA_SERVER", "P2PHANDSHAKE"),
                                   os.getenv("PROTOCOL", "tcp"), "")
        assert rc == 0, rc
        cls.remote = cls.engine.get_first_buffer_address(cls.target)
        assert cls.remote != 0
        cls.local = cls.engine.allocate_managed_buffer(1 << 20)
        assert cls.local != 0

    def _data(self, n):
        return bytes(random.getrandbits(8) for _ in range(n))

    def test_sync_write_read(self):
        for n in (1, 4096, 65536 + 7):
            data = self._data(n)
            self.engine.write_bytes_to_buffer(self.local, data, n)
            self.assertEqual(self.engine.transfer_sync_write(self.target, self.local,
                                                             self.remote, n), 0)
            self.engine.write_bytes_to_buffer(self.local, bytes(n), n)
            self.assertEqual(self.engine.transfer_sync_read(self.target, self.local,
                                                            self.remote, n), 0)
            self.assertEqual(self.engine.read_bytes_from_buffer(self.local, n), data)

    def test_batch_sync(self):
        n, k = 4096, 4
        data = self._data(n * k)
        self.engine.write_bytes_to_buffer(self.local, data, n * k)
        locs = [self.local + i * n for i in range(k)]
        rems = [self.remote + 65536 + i * n for i in range(k)]
        self.assertEqual(self.engine.batch_transfer_sync_write(self.target, locs, rems, [n] * k), 0)
        self.engine.write_bytes_to_buffer(self.local, bytes(n * k), n * k)
        self.assertEqual(self.engine.batch_transfer_sync_read(self.target, locs, rems, [n] * k), 0)
        self.assertEqual(self.engine.read_bytes_from_buffer(self.local, n * k), data)

    def test_batch_async(self):
        n, k = 2048, 8
        data = self._data(n * k)
        self.engine.write_bytes_to_buffer(self.local, data, n * k)
        locs = [self.local + i * n for i in range(k)]
        rems = [self.remote + 131072 + i * n for i in range(k)]
        bid = self.engine.batch_transfer_async_write(self.target, locs, rems, [n] * k)
        self.assertNotEqual(bid, 0)
        self.assertEqual(self.engine.get_batch_transfer_status([bid]), 0)
        self.engine.write_bytes_to_buffer(self.local, bytes(n * k), n * k)
        bid = self.engine.batch_transfer_async_read(self.target, locs, rems, [n] * k)
        self.assertNotEqual(bid, 0)
        self.assertEqual(self.engine.get_batch_transfer_status([bid]), 0)
        self.assertEqual(self.engine.read_bytes_from_buffer(self.local, n * k), data)

    def test_submit_and_poll(self):
        n = 8192
        data = self._data(n)
        self.engine.write_bytes_to_buffer(self.local, data, n)
        bid = self.engine.transfer_submit_write(self.target, self.local, self.remote + 262144, n)
        self.assertGreaterEqual(bid, 0)
        deadline = time.monotonic() + 30
        status = 0
        while status == 0 and time.monotonic() < deadline:
            status = self.engine.transfer_check_status(bid)
            time.sleep(0.001)
        self.assertEqual(status, 1)

    def test_transfer_sync_opcode(self):
        n = 1000
        data = self._data(n)
        self.engine.write_bytes_to_buffer(self.local, data, n)
        self.assertEqual(self.engine.transfer_sync(self.target, self.local, self.remote + 300000,
                                                   n, TransferOpcode.WRITE), 0)
        self.engine.write_bytes_to_buffer(self.local, bytes(n), n)
        self.assertEqual(self.engine.transfer_sync(self.target, self.local, self.remote + 300000,
                                                   n, TransferOpcode.READ), 0)
        self.assertEqual(self.engine.read_bytes_from_buffer(self.local, n), data)

    def test_probe(self):
        self.assertEqual(self.engine.send_probe(self.target), 0)


if __name__ == "__main__":
    unittest.main()
