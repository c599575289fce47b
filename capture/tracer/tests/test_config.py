"""Depth reduction and init-rule classification, on plain dictionaries."""

from coverage_tracer.config import reduce_experts, reduce_layers, zero_dropout
from coverage_tracer.initrules import classify


def test_every_stack_is_cut_and_per_layer_lists_follow():
    d = {
        "num_hidden_layers": 6,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "mlp_only_layers": [0, 4],
        "hidden_size": 64,
        "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 27, "hidden_size": 32},
    }
    layers = reduce_layers(d, 2)
    # Two layers, and the first layer of every kind: the full-attention sixth.
    assert d["num_hidden_layers"] == 3
    assert d["layer_types"] == ["sliding_attention"] * 2 + ["full_attention"]
    assert d["mlp_only_layers"] == [0] and d["hidden_size"] == 64
    assert d["vision_config"]["num_hidden_layers"] == 2 and d["vision_config"]["hidden_size"] == 32
    assert layers == {
        "num_hidden_layers": {"kept": 3, "of": 6},
        "layer_types": {"kept": 3, "of": 6},
        "vision_config.num_hidden_layers": {"kept": 2, "of": 27},
    }


def test_a_backbones_stages_follow_its_layers():
    d = {"num_hidden_layers": 12, "stage_names": ["stem"] + [f"stage{i}" for i in range(1, 13)],
         "out_features": ["stage12"], "out_indices": [12]}
    reduce_layers(d, 2)
    assert d["stage_names"] == ["stem", "stage1", "stage2"]
    assert d["out_features"] == ["stage2"] and d["out_indices"] == [2]
    kept = {"num_hidden_layers": 12, "stage_names": ["stem"] + [f"stage{i}" for i in range(1, 13)],
            "out_features": ["stem", "stage1", "stage2", "stage9"], "out_indices": [0, 1, 2, 9]}
    reduce_layers(kept, 2)
    assert kept["out_features"] == ["stem", "stage1", "stage2"] and kept["out_indices"] == [0, 1, 2]


def test_a_cut_dinov2_backbone_is_a_valid_config():
    # The library's own check of out_features against stage_names.
    from coverage_tracer.config import prepare_config
    config, layers = prepare_config(
        {"model_type": "dinov2", "num_hidden_layers": 12, "hidden_size": 32, "num_attention_heads": 2,
         "intermediate_size": 64, "out_features": ["stage12"], "out_indices": [12]}, 2, "t/dinov2")
    assert config.num_hidden_layers == 2 and config.out_features == ["stage2"]
    assert layers == {"num_hidden_layers": {"kept": 2, "of": 12}}


def test_layers_that_share_weights_keep_two_of_their_kind():
    d = {"model_type": "zamba", "num_hidden_layers": 12,
         "layers_block_type": ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 5 + ["hybrid", "mamba"]}
    reduce_layers(d, 2)
    assert d["num_hidden_layers"] == 4
    assert d["layers_block_type"] == ["mamba", "mamba", "hybrid", "hybrid"]


def test_a_cut_zamba_builds():
    # Its hybrid layers share one transformer block, tied to the first: with
    # one hybrid layer left the library had nothing to tie and refused.
    import transformers

    from coverage_tracer.config import prepare_config
    config, _ = prepare_config(
        {"model_type": "zamba", "architectures": ["ZambaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 12,
         "num_attention_heads": 4, "num_key_value_heads": 4, "attention_hidden_size": 128, "attention_head_dim": 32,
         "intermediate_size": 128, "vocab_size": 128, "mamba_d_state": 8, "n_mamba_heads": 2, "mamba_dt_rank": 8,
         "attn_layer_period": 6, "attn_layer_offset": 4}, 2, "t/zamba")
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(1 for t in config.layers_block_type if t == "hybrid") == 2
    assert len(model.model.layers) == 4


def test_settings_keyed_by_layer_index_are_renumbered():
    d = {"num_hidden_layers": 12, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2,
         "per_layer_config": {"05": {"head_dim": 512}, "11": {"head_dim": 512}}}
    reduce_layers(d, 2)
    assert d["num_hidden_layers"] == 3 and d["per_layer_config"] == {"02": {"head_dim": 512}}


def test_a_depth_given_only_by_a_per_layer_list_is_cut():
    kinds = ["mamba", "moe", "mamba", "moe", "mamba", "attention", "moe", "mamba"]
    d = {"layers_block_type": list(kinds), "mtp_layers_block_type": ["attention", "moe"], "hidden_size": 64}
    layers = reduce_layers(d, 2)
    assert d["layers_block_type"] == ["mamba", "moe", "attention"]
    assert d["mtp_layers_block_type"] == ["attention", "moe"]
    assert layers == {"layers_block_type": {"kept": 3, "of": 8}}


def test_stage_depths_are_capped_not_dropped():
    d = {"depths": [2, 2, 6, 2], "num_layers": 4, "embed_dim": 96}
    layers = reduce_layers(d, 2)
    assert d["depths"] == [2, 2, 2, 2] and d["num_layers"] == 4
    assert layers == {"depths": {"kept": [2, 2, 2, 2], "of": [2, 2, 6, 2]}}


def test_dropout_probabilities_are_zeroed():
    d = {"hidden_dropout_prob": 0.1, "attn_pdrop": 0.1, "drop_path_rate": 0.2, "encoder_layerdrop": 0.1,
         "text_config": {"attention_dropout": 0.3}, "id2label": {0: "a"}, "use_dropout": True}
    zero_dropout(d)
    assert d["hidden_dropout_prob"] == d["attn_pdrop"] == d["drop_path_rate"] == d["encoder_layerdrop"] == 0.0
    assert d["text_config"]["attention_dropout"] == 0.0 and d["use_dropout"] is True


def test_init_rules_from_call_history():
    assert classify([("uniform_", {"from": -0.1, "to": 0.1}), ("normal_", {"mean": 0.0, "std": 0.02})]) == {
        "rule": "normal", "mean": 0.0, "std": 0.02}
    assert classify([("fill_", {"value": 1})]) == {"rule": "ones"}
    assert classify([("zero_", {})]) == {"rule": "zeros"}
    assert classify([("uniform_", {"from": -0.5, "to": 0.5})]) == {"rule": "uniform", "lo": -0.5, "hi": 0.5}
    assert classify([("create:zeros", {})]) == {"rule": "zeros"}
    assert classify([("create:reciprocal", {})])["rule"] == "other"
    assert classify([])["rule"] == "other"


def test_experts_are_cut_and_the_routers_top_k_is_kept():
    # Qwen3-MoE: 128 experts, top-8 of them; a cut to 4 keeps 8 (the top-k).
    d = {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "n_shared_experts": 1}
    assert reduce_experts(d, 4) == {"num_experts": {"kept": 8, "of": 128}}
    assert d["num_experts_per_tok"] == 8 and d["moe_intermediate_size"] == 768 and d["n_shared_experts"] == 1
    # Mixtral: 8 experts, top-2: a cut to 8 cuts nothing.
    mixtral = {"num_local_experts": 8, "num_experts_per_tok": 2}
    assert reduce_experts(mixtral, 8) == {} and mixtral["num_local_experts"] == 8
    # 0 keeps every expert.
    assert reduce_experts({"n_routed_experts": 256}, 0) == {}


def test_group_limited_routing_keeps_two_experts_in_every_group():
    # DeepSeek-V3: 256 experts in 8 groups, 4 groups kept, top-8: a group
    # scores as its best two experts, so each of the 8 groups keeps 2.
    d = {"n_routed_experts": 256, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8}
    assert reduce_experts(d, 8) == {"n_routed_experts": {"kept": 16, "of": 256}}
    # Top-k larger than the kept groups can hold at two each: more per group.
    wide = {"n_routed_experts": 160, "n_group": 8, "topk_group": 2, "num_experts_per_tok": 6}
    reduce_experts(wide, 8)
    assert wide["n_routed_experts"] == 24  # 3 per group, 2 groups hold the top-6


def test_experts_are_cut_in_sub_configs():
    d = {"model_type": "llama4", "text_config": {"model_type": "llama4_text", "num_local_experts": 128,
                                                 "num_experts_per_tok": 1},
         "vision_config": {"model_type": "llama4_vision_model", "num_hidden_layers": 2}}
    assert reduce_experts(d, 8) == {"text_config.num_local_experts": {"kept": 8, "of": 128}}
