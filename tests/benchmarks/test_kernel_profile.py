"""The kernel breakdown of a profiled request: names classed as the libraries spell them, time and idle summed.

The trace is written here in the torch profiler's chrome format (GPU kernels cannot be recorded on CPU CI); the
kernel names are ones an H100 trace of the rollout shows (cuBLASLt, FlashAttention 3, cuDNN, inductor).
"""

import gzip
import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def kernel_profile():
    return load_benchmark("kernel_profile")


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "matmul"),
        ("triton_tem_fused_addmm_3", "matmul"),
        ("void flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<...>>>", "attention"),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", "convolution"),
        ("triton_poi_fused_add_mul_native_layer_norm_7", "other"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
    ],
)
def test_kernel_names_are_classed(kernel_profile, name, label):
    assert kernel_profile.kernel_class(name) == label


def test_summary_sums_classes_and_idle_and_rates_the_matmuls(kernel_profile, tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "nvjet_tst_a", "ts": 0, "dur": 600},
        {"ph": "X", "cat": "kernel", "name": "nvjet_tst_b", "ts": 700, "dur": 200},
        {"ph": "X", "cat": "kernel", "name": "void flash::FlashAttnFwdSm90<x>", "ts": 900, "dur": 50},
        {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_mul_1", "ts": 950, "dur": 30},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 990, "dur": 10},
        # host-side ops and instant events are not GPU time
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},
        {"ph": "i", "cat": "kernel", "name": "nvjet_marker", "ts": 0},
    ]
    trace = tmp_path / "trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)

    summary = kernel_profile.summarize(kernel_profile.load_events(trace))

    assert summary["gpu_span_s"] == pytest.approx(1000e-6)
    assert summary["kernel_s"] == pytest.approx({"matmul": 800e-6, "attention": 50e-6, "other": 30e-6, "copy": 10e-6})
    assert summary["idle_s"] == pytest.approx(110e-6)
    assert summary["share_of_span"]["matmul"] == pytest.approx(0.8)
    assert list(summary["top_other_kernels_s"]) == ["triton_poi_fused_mul_1"]
    # 0.4 TFLOP of matmuls in 800 µs: 500 TFLOP/s, half of a 1000 TFLOP/s ceiling
    rates = kernel_profile.achieved(summary, {"matmul": 0.4, "attention": 0.01}, 1000.0)
    assert rates["matmul"]["tflops"] == pytest.approx(500.0)
    assert rates["matmul"]["fraction_of_ceiling"] == pytest.approx(0.5)
    assert rates["attention"]["tflops"] == pytest.approx(200.0)


def test_a_trace_without_gpu_kernels_is_refused(kernel_profile, tmp_path):
    trace = tmp_path / "cpu.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9}]}))
    with pytest.raises(ValueError, match="no GPU kernel events"):
        kernel_profile.summarize(kernel_profile.load_events(trace))
