"""benchmarks/train_step_profile.py: kernels fall into the groups a step's time is reported by, and a run's
profile adds up."""

import json

import pytest

from benchmarks.train_step_profile import group_of, main
from training_helpers import TINY_WAN


@pytest.mark.parametrize("name, group", [
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", "attention"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false>>", "attention"),
    ("summary_kernel", "attention"),
    ("dense_query_grad_kernel", "attention"),
    ("cpe_add_kernel", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas",
     "matmuls"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN", "matmuls"),
    ("aten::addmm", "matmuls"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "norms"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norms"),
    ("void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4>>", "optimizer"),
    ("aten::_foreach_mul_", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "other"),
    ("aten::mul", "other"),
])
def test_kernels_fall_into_their_group(name, group):
    assert group_of(name) == group


def test_a_tiny_runs_profile_adds_up(tmp_path):
    out = tmp_path / "profile.json"
    summary = main(["-", f"output_dir={tmp_path / 'run'}", *TINY_WAN, "model.attention=mhla", "model.blocks=[2,1,1]",
                    "--warmup", "1", "--steps", "2", "--out", str(out)])
    assert json.loads(out.read_text())["ms_per_step"] == summary["ms_per_step"]
    groups = summary["ms_per_step"]
    assert groups["attention"] > 0 and groups["matmuls"] > 0 and groups["optimizer"] > 0
    assert summary["kernel_ms_per_step"] == pytest.approx(sum(groups.values()), abs=0.01)
    assert summary["wall_ms_per_step"] >= summary["host_wait_ms_per_step"] >= 0
    assert summary["steps"] == 2


def test_bad_step_counts_name_the_option(capsys):
    with pytest.raises(SystemExit):
        main(["-", "output_dir=x", "--steps", "0"])
    assert "--steps=0 is not allowed: use an int >= 1" in capsys.readouterr().err
