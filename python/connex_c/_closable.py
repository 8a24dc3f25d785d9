"""What Engine and Group share as owners of a C handle: `with` closes, and so does the garbage
collector for an object nobody closed. The class defines close() (idempotent) and closed."""


class Closable:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:   # also when __init__ failed half-way: then the attributes close() reads are missing
            if not self.closed:
                self.close()
        except Exception:
            pass
