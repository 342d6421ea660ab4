import gc

from cgtool.runners.pool import freeze_gc, is_capture_mode, model_capture_mode


def test_freeze_gc_disables_collection_and_restores_it():
    assert gc.isenabled()
    with freeze_gc(enable_cudagraph_gc=False):
        assert not gc.isenabled()
        with freeze_gc(enable_cudagraph_gc=False):  # a runner's own freeze inside the loop's
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_enable_cudagraph_gc_keeps_the_collector_on():
    with freeze_gc(enable_cudagraph_gc=True):
        assert gc.isenabled()


def test_capture_mode_flag_is_scoped():
    assert not is_capture_mode()
    with model_capture_mode():
        assert is_capture_mode()
    assert not is_capture_mode()
