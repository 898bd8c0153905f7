"""strata_ref.native.mmvq.OnDevice on the CPU, against a stand-in library
whose current device is per thread as the CUDA runtime's is: every call from
any thread runs on the handle's device."""
import threading

from strata_ref.native.mmvq.wrapper import OnDevice


class FakeLib:
    """Records (thread's current device, call) for each device-bound call."""

    def __init__(self, fail_set=False):
        self.local = threading.local()
        self.calls = []
        self.fail_set = fail_set

    def smv_get_device(self):
        return getattr(self.local, "dev", 0)

    def smv_set_device(self, d):
        self.calls.append(("set", d))
        if self.fail_set:
            return 6
        self.local.dev = d
        return 0

    def smv_mmvq(self, *args):
        self.calls.append(("mmvq", self.smv_get_device(), args))
        return 0

    def smv_set_plain_kernel(self, k):
        self.calls.append(("plain", self.smv_get_device(), k))
        return 0


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_a_call_from_another_thread_runs_on_the_handles_device():
    fake = FakeLib()
    lib = OnDevice(fake, 1)
    fake.local.dev = 1                         # the loading thread: device 1 is current
    assert lib.smv_mmvq(1, 2) == 0
    assert fake.calls == [("mmvq", 1, (1, 2))]
    fake.calls.clear()
    assert _in_thread(lambda: (lib.smv_mmvq(3), lib.smv_mmvq(4))) == (0, 0)
    # the new thread starts on device 0: set once, then both calls on device 1
    assert fake.calls == [("set", 1), ("mmvq", 1, (3,)), ("mmvq", 1, (4,))]


def test_two_handles_of_one_library_keep_their_devices():
    fake = FakeLib()
    d0, d1 = OnDevice(fake, 0), OnDevice(fake, 1)
    d1.smv_mmvq("a")
    d0.smv_mmvq("b")
    d1.smv_mmvq("c")
    assert [c for c in fake.calls if c[0] == "mmvq"] == [("mmvq", 1, ("a",)), ("mmvq", 0, ("b",)),
                                                         ("mmvq", 1, ("c",))]


def test_a_failed_device_switch_is_the_calls_status_and_runs_nothing():
    fake = FakeLib(fail_set=True)
    lib = OnDevice(fake, 2)
    assert lib.smv_mmvq(1) == 6
    assert fake.calls == [("set", 2)]


def test_process_wide_settings_need_no_device():
    fake = FakeLib(fail_set=True)
    lib = OnDevice(fake, 3)
    assert lib.smv_set_plain_kernel(3) == 0
    assert fake.calls == [("plain", 0, 3)]
    assert lib.device == 3
