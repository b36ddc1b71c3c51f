"""The oracles' case runner: each case runs, prints PASS or FAIL with its message, and the next
one runs whatever the last did; summary() prints `N passed, M failed` and returns the exit code."""


class Cases:
    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, name, fn):
        try:
            msg = fn()
            print(f"PASS {name}{': ' + msg if msg else ''}", flush=True)
            self.passed += 1
        except Exception as e:  # noqa: BLE001  (every failure is reported, then the next case)
            print(f"FAIL {name}: {e}", flush=True)
            self.failed += 1

    def summary(self):
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
