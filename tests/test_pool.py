import gc

from cgtool.runners.pool import freeze_gc, is_capture_mode, model_capture_mode


def test_freeze_gc_disables_collection_and_restores_it():
    assert gc.isenabled()
    with freeze_gc(enable_cudagraph_gc=False):
        assert not gc.isenabled()
        with freeze_gc(enable_cudagraph_gc=False):  # nested: leaves the outer's collector off
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_freeze_gc_leaves_a_collector_that_was_off_off():
    gc.disable()
    try:
        with freeze_gc(enable_cudagraph_gc=False):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_enable_cudagraph_gc_keeps_the_collector_on():
    with freeze_gc(enable_cudagraph_gc=True):
        assert gc.isenabled()


def test_capture_mode_flag_is_scoped():
    assert not is_capture_mode()
    with model_capture_mode():
        assert is_capture_mode()
    assert not is_capture_mode()
