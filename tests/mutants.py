"""
The mutation check: plausible bugs, put one at a time into a copy of the repo; each must fail the tests named for
the behaviour it breaks. Not collected by pytest (no test_ prefix); run it after changing tests or the code they pin:

    python tests/mutants.py                     # every mutant (10–60 s each: only its own tests)
    python tests/mutants.py --list              # the mutants and their tests
    python tests/mutants.py --only cosine_reversed,t_at_n_df
    python tests/mutants.py --baseline          # first check that each selection passes on the unmutated copy

Each mutant is (name, file, an exact snippet of it, its replacement, the pytest arguments that should kill it).
A snippet that no longer occurs exactly once is reported as ERROR, so the list can't rot silently: after a
refactor, fix the snippet. Result per mutant: killed (a selected test failed), SURVIVED (all passed: a test is
missing), ERROR (snippet gone or ambiguous, no test selected, or pytest itself broke); exit status 1 unless every
mutant is killed.

Why an explicit list rather than a mutation tool: mutmut (3.8) and cosmic-ray (8.7) both install from PyPI and run
offline, but they generate every operator and constant swap of a file (hundreds for model.py alone, most of them
equivalent or in error messages) and run the tests covering each one; with tests that train tiny models in
subprocesses that is hours on 2 cores, and a survivor says less than a bug someone could actually write. Here
every mutant is such a bug, in the core the paper rests on and in what the docs promise. The generated counterpart,
restricted to the training-critical functions so that it fits in an hour, is tests/generated_mutants.py; the real bugs
among its survivors are at the end of this list.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]


class Mutant(NamedTuple):
    name: str
    file: str
    original: str
    replacement: str
    tests: tuple  # pytest arguments, run with -x -q


def k(file, expression):
    return (f'tests/{file}', '-k', expression)


CONFIG = 'value_takes or another_type or optional_keys or in_order or unknown_key or saved_config'
DTYPE = ('tests/test_common.py', 'tests/test_train.py', '-k', 'dtype')  # test_train.py: the capability boundaries

MUTANTS = [
    # the statistics, the checkpoint, the data order and the schedule
    Mutant('t_at_n_df', 'lab/stats.py', 'p = t_two_sided_p(mean / se, n - 1)', 'p = t_two_sided_p(mean / se, n)',
           k('test_sweep.py', 'critical_value')),
    Mutant('t_one_sided', 'lab/stats.py', 'return float(2 * stats.t.sf(abs(t), df))',
           'return float(stats.t.sf(abs(t), df))', k('test_sweep.py', 'critical_value')),
    Mutant('checkpoint_written_in_place', 'common.py', 'tmp = f"{path}.tmp"', 'tmp = path',
           k('test_common.py', 'save_that_dies')),
    Mutant('data_order_by_operator', 'train.py', 'data_rng = torch.Generator().manual_seed(cfg.seed)',
           'data_rng = torch.Generator().manual_seed(cfg.seed + len(cfg.operator))',
           k('test_train.py', 'same_batches')),
    Mutant('cosine_reversed', 'train.py', '0.5 * (1.0 + math.cos(', '0.5 * (1.0 - math.cos(',
           k('test_train.py', 'learning_rate_warms')),
    # exact resume and the operator's gradient
    Mutant('data_rng_not_restored', 'run.py', "data_rng.set_state(ckpt['rng']['data'])", 'pass',
           k('test_train.py', 'resume_logs_the_same_losses')),
    Mutant('operator_gradient_detached', 'model.py', 'return c_I * v + c_P * pv', 'return c_I * v + c_P * pv.detach()',
           k('test_model.py', 'gradient')),
    Mutant('causal_mask_off_by_one', 'model.py', 'dtype=torch.bool).tril()', 'dtype=torch.bool).tril(1)',
           k('test_model.py', 'future_tokens or math_path')),
    Mutant('delta_orth_normalised_by_trace', 'lab/connection.py', 'off / (trace / math.sqrt(d))', 'off / trace',
           k('test_walk.py', 'naive')),
    # the operator and the model
    Mutant('alpha_beta_coefficients', 'model.py', '(beta, alpha - beta)', '(beta, alpha + beta)',
           k('test_model.py', 'alpha_forms or follow_the_table')),
    Mutant('c_P_dropped_from_the_operator_line', 'model.py', 'return c_I * v + c_P * pv', 'return c_I * v + pv',
           k('test_model.py', 'operator_is_cI')),
    Mutant('fast_path_reads_the_keys_as_values', 'model.py', 'F.scaled_dot_product_attention(q, k_all, v_all,',
           'F.scaled_dot_product_attention(q, k_all, k_all,', k('test_model.py', 'fast_path_equals_math_path')),
    Mutant('temperature_multiplies', 'model.py', 'logits = logits / temperature', 'logits = logits * temperature',
           k('test_model.py', 'sampling_frequencies')),
    Mutant('top_k_keeps_one', 'model.py', '.values[:, [-1]]', '.values[:, [0]]',
           k('test_model.py', 'sampling_frequencies')),
    # training
    Mutant('warmup_from_zero', 'train.py', '(it + 1) / (cfg.warmup_iters + 1)', 'it / cfg.warmup_iters',
           k('test_train.py', 'learning_rate_warms')),
    Mutant('best_val_loss_overwritten', 'train.py',
           "progress['best_val_loss'] = min(progress['best_val_loss'], losses['val'])",
           "progress['best_val_loss'] = losses['val']", k('test_train.py', 'best_val_loss')),
    Mutant('grad_clip_tenfold', 'train.py', 'model.parameters(), cfg.grad_clip)', 'model.parameters(), 10 * cfg.grad_clip)',
           k('test_train.py', 'grad_clip')),
    Mutant('sigterm_ignored', 'run.py', 'signal.signal(signal.SIGTERM, self.handle)', 'pass',
           k('test_train.py', 'sigterm')),
    Mutant('second_signal_ignored', 'run.py', 'raise KeyboardInterrupt', 'return',
           k('test_train.py', 'second_signal')),
    Mutant('stale_log_lines_kept', 'run.py', "if e.get('iter', math.inf) <= iter_num]", "if True]",
           k('test_train.py', 'drops_log_lines')),
    Mutant('eval_only_goes_on_training', 'train.py', 'if cfg.eval_only:', 'if False:',
           k('test_train.py', 'eval_only')),
    Mutant('overwrite_keeps_old_checkpoints', 'run.py', 'os.remove(os.path.join(cfg.out_dir, name))', 'pass',
           k('test_train.py', 'overwrite')),
    Mutant('snapshots_at_every_eval', 'train.py', 'iter_num % cfg.snapshot_interval == 0',
           'iter_num % cfg.eval_interval == 0', k('test_train.py', 'snapshots')),
    # the walk
    Mutant('sem_over_n_minus_1', 'lab/connection.py', 'v.std(0) / math.sqrt(N)', 'v.std(0) / math.sqrt(N - 1)',
           k('test_walk.py', 'standard_errors')),
    Mutant('null_head_ratio_inverted', 'lab/connection.py', 'null = (1 + d / d_h *', 'null = (1 + d_h / d *',
           k('test_walk.py', 'monte_carlo')),
    Mutant('delta_orth_trace_by_d', 'lab/connection.py', "[x / math.sqrt(d) for x in r['delta_orth']]",
           "[x / d for x in r['delta_orth']]", k('test_walk.py', 'naive')),
    Mutant('walk_logs_only_the_first_names', 'lab/connection.py',
           'geometry[part] = {key: result[key] for key in per_layer()}',
           'geometry[part] = {key: result[key] for key in RESULT_ORDER}', k('test_walk.py', 'new_diagnostic')),
    Mutant('walk_panels_of_import_time', 'lab/figures.py', '    panels = walk_panels()\n',
           '    panels = walk_panels()[:4]\n', k('test_walk.py', 'new_diagnostic')),
    # the study reports
    Mutant('dynamics_quarter_at_half', 'lab/reports.py', 'gamma[int(0.75 * (len(gamma) - 1)):]',
           'gamma[int(0.5 * (len(gamma) - 1)):]', k('test_sweep.py', 'report_states or pretrained_report or per_layer')),
    Mutant('per_layer_inside_is_the_corridor', 'lab/reports.py', "in_corridor(gamma, CLAIM_B)", "in_corridor(gamma)",
           k('test_sweep.py', 'per_layer')),
    Mutant('scales_occupancy_all_layers', 'lab/study_figures.py', "{cell} | {c['occupancy_beyond_first']:.0%}",
           "{cell} | {c['occupancy']:.0%}", k('test_sweep.py', 'report_states')),
    Mutant('geometry_base_not_averaged', 'lab/study_figures.py', 'cells = [f"{statistics.fmean(base.values()):.4g}"]',
           'cells = [f"{max(base.values()):.4g}"]', k('test_sweep.py', 'report_states')),
    Mutant('pretrained_frozen_from_last_eval', 'lab/study_figures.py', "- loaded[(a, s)]['log'][0]['val_loss']",
           "- loaded[(a, s)]['log'][1]['val_loss']", k('test_sweep.py', 'pretrained_report')),
    # the operator inside a transformers model
    Mutant('hf_identity_wrong_kv_head', 'lab/pretrained.py', '.repeat_interleave(H // value.shape[1], dim=1)',
           '.repeat(1, H // value.shape[1], 1, 1)', k('test_hf.py', 'own_value_head')),
    Mutant('hf_identity_from_cache_start', 'lab/pretrained.py', 'v = value[:, :, -T:]', 'v = value[:, :, :T]',
           k('test_hf.py', 'own_value_head or kv_cache')),
    Mutant('hf_operator_only_saves_all', 'run.py', "if '.coefficients.' in k} if train_only == 'operator' else state",
           "if '.coefficients.' in k} if False else state", k('test_train.py', 'operator_only')),
    Mutant('probe_at_trained_gamma', 'lab/probe.py', "operator='corridor', gamma_init=0.0,",
           "operator='corridor', gamma_init=-0.1,", k('test_probe.py', 'derivative')),
    Mutant('verdict_population_std', 'lab/stats.py', 'statistics.stdev(differences) if len(differences) > 1',
           'statistics.pstdev(differences) if len(differences) > 1', k('test_sweep.py', 'critical_value')),
    # survivors of the generated run (tests/generated_mutants.py) that no test caught and this list lacked
    Mutant('layernorm_and_biases_decayed', 'model.py', "id(p) not in operator], 0.0, 1.0),",
           "id(p) not in operator], 1.0, 1.0),", k('test_model.py', 'exactly_the_matrices')),
    Mutant('no_decay_group_lr_doubled', 'model.py', "id(p) not in operator], 0.0, 1.0),",
           "id(p) not in operator], 0.0, 2.0),", k('test_model.py', 'exactly_the_matrices')),
    Mutant('laplacian_scalars_learn', 'model.py', "'laplacian':  OperatorForm(('gamma', 'delta'), learnable=False,",
           "'laplacian':  OperatorForm(('gamma', 'delta'), learnable=True,", k('test_model.py', 'never_move')),
    Mutant('generate_default_temperature_2', 'model.py', 'def generate(self, idx, max_new_tokens, temperature=1.0,',
           'def generate(self, idx, max_new_tokens, temperature=2.0,', k('test_model.py', 'by_default')),
    Mutant('clamp_passes_a_push_at_zero', 'model.py', '(raw > 0) | (grad < 0)', '(raw >= 0) | (grad < 0)',
           k('test_model.py', 'blocks_a_push')),
    Mutant('clamp_passes_small_pushes', 'model.py', '(raw > 0) | (grad < 0)', '(raw > 0) | (grad < 1)',
           k('test_model.py', 'blocks_a_push')),
    Mutant('c_I_and_c_P_swapped', 'model.py', 'c_I, c_P = (c.view(-1, 1) for c in self.coefficients())',
           'c_P, c_I = (c.view(-1, 1) for c in self.coefficients())', k('test_model.py', 'operator_is_cI')),
    Mutant('eval_keeps_the_last_batch', 'train.py', 'total += torch.stack([loss.float()',
           'total = torch.stack([loss.float()', k('test_train.py', 'estimate_loss')),
    Mutant('eval_loss_not_divided', 'train.py', 'out[split] = (total[0] / total[1]).item()',
           'out[split] = (total[0] * total[1]).item()', k('test_train.py', 'estimate_loss')),
    Mutant('group_lr_divided_by_its_multiplier', 'train.py', "group['lr'] = lr * group['lr_mult']",
           "group['lr'] = lr / group['lr_mult']", k('test_train.py', 'each_step_uses')),
    Mutant('evaluations_off_by_one', 'train.py', 'iter_num % cfg.eval_interval == 0 or',
           'iter_num % cfg.eval_interval == 1 or', k('test_train.py', 'evaluations_fall')),
    Mutant('micro_batch_losses_summed', 'train.py', 'loss = loss / len(offsets)', 'loss = loss * len(offsets)',
           k('test_train.py', 'gradient_accumulation')),
    Mutant('window_loss_of_the_last_micro_batch', 'train.py', "total = total + loss.detach()",
           "total = loss.detach()", k('test_train.py', 'gradient_accumulation')),
    Mutant('window_loss_negated', 'train.py', "total = total + loss.detach()", "total = total - loss.detach()",
           k('test_train.py', 'gradient_accumulation')),
    Mutant('last_micro_batch_not_loaded', 'train.py', 'if micro_step + 1 < len(offsets):',
           'if micro_step + 2 < len(offsets):', k('test_train.py', 'gradient_accumulation')),
    Mutant('micro_batch_loaded_from_behind', 'train.py', "offsets[micro_step + 1])", "offsets[micro_step - 1])",
           k('test_train.py', 'gradient_accumulation')),
    # what a docstring or the README promises, in five areas
    # the configurator's type checks (common.py)
    Mutant('config_bool_counts_as_int', 'common.py', 'or type(value) is type(default) and not isinstance(default, float)',
           'or isinstance(value, type(default)) and not isinstance(default, float)', k('test_common.py', CONFIG)),
    Mutant('config_int_kept_where_a_float_is', 'common.py', 'return float(value)', 'return value',
           k('test_common.py', CONFIG)),
    Mutant('config_bool_accepted_as_float', 'common.py',
           'isinstance(value, (int, float)) and not isinstance(value, bool)', 'isinstance(value, (int, float))',
           k('test_common.py', CONFIG)),
    Mutant('config_none_for_any_key', 'common.py', 'if value is None and key in optional or',
           'if value is None or', k('test_common.py', CONFIG)),
    Mutant('config_saved_values_unchecked', 'common.py', 'config[key] = _checked(key, saved[key], defaults[key], ())',
           'config[key] = saved[key]', k('test_common.py', CONFIG)),
    Mutant('config_dropout_one_allowed', 'common.py', 'not 0 <= c.dropout < 1', 'not 0 <= c.dropout <= 1',
           k('test_common.py', 'no_model or boundary_a_model')),
    Mutant('config_laplacian_heads_below_n_head', 'common.py', 'not 1 <= c.laplacian_heads <= c.n_head',
           'not 1 <= c.laplacian_heads < c.n_head', k('test_common.py', 'no_model or boundary_a_model')),
    Mutant('config_gamma_nonneg_strict', 'common.py', 'c.gamma_init - c.init_spread < 0,',
           'c.gamma_init - c.init_spread <= 0,', k('test_common.py', 'no_model or boundary_a_model')),
    # the data-size check (sources.py)
    Mutant('data_block_size_tokens_let_through', 'sources.py', 'if size // dtype.itemsize <= at_least[0]:',
           'if size // dtype.itemsize < at_least[0]:', k('test_train.py', 'one_token_more')),
    Mutant('data_exactly_enough_refused', 'sources.py', 'if size // dtype.itemsize <= at_least[0]:',
           'if size // dtype.itemsize <= at_least[0] + 1:', k('test_train.py', 'one_token_more')),
    Mutant('data_needs_a_batch_of_windows', 'sources.py', '            block_size, f"block_size={block_size} needs',
           '            block_size * batch_size, f"block_size={block_size} needs', k('test_train.py', 'one_token_more')),
    Mutant('data_val_split_unchecked', 'sources.py', '            block_size, f"block_size={block_size} needs',
           '            block_size if split == \'train\' else 0, f"block_size={block_size} needs',
           k('test_train.py', 'one_token_more')),
    Mutant('data_offsets_one_short', 'sources.py', 'self.n_tokens[split] - self.block_size,',
           'self.n_tokens[split] - self.block_size - 1,', k('test_train.py', 'one_token_more')),
    # the DDP log lines (train.py's header, run.LogWindow)
    Mutant('ddp_tokens_per_process', 'train.py',
           'tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size',
           'tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size // world',
           k('test_train.py', 'ddp_two_gloo and learnable')),
    Mutant('ddp_every_rank_prints_the_header', 'train.py', 'if rank == 0:\n        print(f"{raw_model.get_num_params()',
           'if True:\n        print(f"{raw_model.get_num_params()', k('test_train.py', 'ddp_two_gloo and learnable')),
    Mutant('ddp_micro_batches_not_divided_among_processes', 'run.py',
           'if cfg.gradient_accumulation_steps % world:', 'if cfg.gradient_accumulation_steps < world:',
           k('test_run.py', 'torchrun')),
    Mutant('ddp_nccl_on_the_cpu', 'run.py', "('nccl' if cuda else 'gloo')", "('gloo' if cuda else 'nccl')",
           k('test_run.py', 'torchrun')),
    Mutant('ddp_processes_leave_without_waiting', 'run.py', 'dist.barrier()\n        dist.destroy_process_group()',
           'dist.destroy_process_group()', k('test_run.py', 'torchrun')),
    Mutant('ddp_mfu_of_all_devices', 'run.py', 'mfu = self.flops_per_iter / dt / self.world / self.peak',
           'mfu = self.flops_per_iter / dt / self.peak', k('test_run.py', 'under_ddp')),
    Mutant('ddp_tokens_per_second_of_one_process', 'run.py', 'self.tokens_per_iter / dt:,.0f} tok/s',
           'self.tokens_per_iter / dt / self.world:,.0f} tok/s', k('test_run.py', 'under_ddp')),
    Mutant('ddp_window_loss_summed_over_processes', 'run.py', 'shared[0].item() / self.world / self.iters',
           'shared[0].item() / self.iters', k('test_run.py', 'under_ddp')),
    Mutant('ddp_stop_of_another_process_missed', 'run.py', 'shared[1].item() > 0', 'stop_seen',
           k('test_run.py', 'under_ddp')),
    # dtype='auto' (common.resolve_dtype)
    Mutant('auto_dtype_of_gpu_0', 'common.py', 'torch.cuda.get_device_capability(torch.device(device))',
           'torch.cuda.get_device_capability()', DTYPE),
    Mutant('auto_dtype_overrides_an_explicit_one', 'common.py',
           "    if dtype != 'auto':\n        return dtype\n", "    if dtype == 'float32':\n        return dtype\n", DTYPE),
    Mutant('auto_dtype_on_a_cpu_ignores_its_bf16_units', 'common.py',
           "if not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):",
           "if not torch.cpu._is_avx512_bf16_supported():", DTYPE),
    Mutant('auto_dtype_on_a_cpu_ignores_the_width', 'common.py', "if n_embd is None or n_embd < CPU_BF16_MIN_WIDTH:",
           "if n_embd is None:", DTYPE),
    Mutant('auto_dtype_of_a_cpu_run_before_its_model', 'train.py',
           "resolve_dtype(cfg.dtype, device, raw_model.config.n_embd)", "resolve_dtype(cfg.dtype, device)", DTYPE),
    Mutant('a_study_mixes_dtypes', 'lab/sweep.py', "if trained != config['dtype']:", "if False:",
           ('tests/test_sweep.py', '-k', 'dtype_other')),
    Mutant('auto_dtype_bf16_from_hopper_only', 'common.py', "[0] >= 8 else 'float16'", "[0] > 8 else 'float16'",
           DTYPE),
    Mutant('auto_dtype_counts_emulated_bf16', 'common.py',
           "'bfloat16' if torch.cuda.get_device_capability(torch.device(device))[0] >= 8",
           "'bfloat16' if torch.cuda.is_bf16_supported()", DTYPE),
    # the log line's occupancy shares (train.operator_summary, model.in_corridor)
    Mutant('occupancy_claim_b_at_zero', 'train.py', 'for below in (CLAIM_B, 0.0))', 'for below in (0.0, 0.0))',
           k('test_train.py', 'strictly_inside')),
    Mutant('occupancy_shares_swapped', 'train.py', 'deep, corridor = (', 'corridor, deep = (',
           k('test_train.py', 'strictly_inside')),
    Mutant('occupancy_of_the_first_layer', 'train.py', 'in_corridor(gamma, below).float().mean()',
           'in_corridor(gamma[0], below).float().mean()', k('test_train.py', 'strictly_inside')),
    Mutant('occupancy_any_negative_gamma', 'train.py', 'in_corridor(gamma, below).float().mean()',
           '(gamma < below).float().mean()', k('test_train.py', 'strictly_inside')),
    Mutant('corridor_closed_interval', 'model.py', 'return (gamma > -1) & (gamma < below)',
           'return (gamma >= -1) & (gamma <= below)', k('test_train.py', 'strictly_inside')),
    # `python -m lab.sweep --launcher=slurm` without SLURM
    Mutant('slurm_absence_unchecked', 'lab/launch.py', "if not shutil.which('sbatch'):", 'if False:',
           k('test_sweep.py', 'without_slurm')),
    # checkpoint bytes against torch.save's CRC-32s, and finite (lab/file_checks.py: changed_records, check_tensors)
    Mutant('crc_pickle_only_always', 'lab/file_checks.py',
           "if info.CRC == 0 or pickle_only and not info.filename.endswith('/data.pkl'):",
           "if info.CRC == 0 or not info.filename.endswith('/data.pkl'):", ('tests/test_sources.py',)),
    Mutant('crc_every_tensor_blamed', 'lab/file_checks.py', 'if zlib.crc32(storage.numpy()) not in saved_crcs:',
           'if zlib.crc32(storage.numpy()) in saved_crcs or True:', ('tests/test_sources.py',)),
    Mutant('finite_by_the_sum_alone', 'lab/file_checks.py',
           'not torch.isfinite(t.sum()) and not torch.isfinite(t).all():', 'not torch.isfinite(t.sum()):',
           ('tests/test_sources.py',)),
    # docs/results_recomputed.py: studies.md's tables from the per-seed files (Holm within the report's families)
    Mutant('recomputed_holm_over_every_cell', 'docs/results_recomputed.py',
           "adjusted = holm_within({k: t for k, (t, _) in tests.items()}, lambda k: family(study, k[1], k[2]))",
           "adjusted = holm_within({k: t for k, (t, _) in tests.items()}, lambda k: 'one')", ('tests/test_docs.py',)),
    Mutant('recomputed_paired_with_one_seed', 'docs/results_recomputed.py',
           "return [runs[(setting, a, k)]['val_loss'] - runs[(setting, b, k)]['val_loss'] for k in seeds]",
           "return [runs[(setting, a, k)]['val_loss'] - runs[(setting, b, seeds[0])]['val_loss'] for k in seeds]",
           ('tests/test_docs.py',)),
    # the renderers of claim (b)'s and the 135M study's tables: heads, not layers, are the unit; layer 0 apart; one family
    Mutant('layers_averaged_unweighted', 'docs/results_recomputed.py',
           "return sum(layer[key] * layer['heads'] for layer in layers) / sum(layer['heads'] for layer in layers)",
           "return sum(layer[key] for layer in layers) / len(layers)", ('tests/test_docs.py',)),
    Mutant('dynamics_rest_with_layer_0', 'docs/results_recomputed.py', "    rest = layers[1:]\n", "    rest = layers\n",
           ('tests/test_docs.py',)),
    Mutant('held_gamma_on_any_bound', 'docs/results_recomputed.py',
           "deep = 'on the bound' if low == high == CLAIM_B else", "deep = 'on the bound' if low == high else",
           ('tests/test_docs.py::test_the_135m_tables_hold_every_cell_in_one_holm_family_trained_by_seed_frozen_by_batch',)),
    Mutant('pretrained_holm_per_cell', 'docs/results_recomputed.py',
           "adjusted = holm_within(tests, lambda key: 'every cell of the study')",
           "adjusted = holm_within(tests, lambda key: key)", ('tests/test_docs.py',)),
    # the geometry study's walk file: each part against attention's P on the same seed, Holm per variant and part
    Mutant('walk_holm_over_both_parts', 'docs/results_recomputed.py',
           "adjusted = holm_within({k: t for k, (t, _) in tests.items()}, lambda k: k[1:3])  # variant × part",
           "adjusted = holm_within({k: t for k, (t, _) in tests.items()}, lambda k: k[1])", ('tests/test_docs.py',)),
    Mutant('walk_row_not_written_for_attention', 'lab/study_figures.py',
           "walk_rows += [(setting, 'attention', s, 'P', key, regime, b) for s, b in base.items()]", "pass",
           ('tests/test_sweep.py::test_geometry_report_states_attentions_value_and_the_paired_differences',)),
    Mutant('gamma_change_over_the_last_half', 'lab/reports.py',
           "return means[-1] - means[int(0.75 * (len(means) - 1))]",
           "return means[-1] - means[int(0.5 * (len(means) - 1))]",
           ('tests/test_sweep.py::'
            'test_gammas_last_quarter_change_is_the_last_mean_minus_the_one_three_quarters_of_the_way',)),
    Mutant('interim_study_on_the_page', 'docs/results_recomputed.py',
           "if have >= planned:  # a study still running is not on the page yet", "if runs:",
           ('tests/test_docs.py::'
            'test_the_settled_corridor_table_is_its_per_seed_cells_and_stays_off_the_page_until_every_run_is_in',)),
    # a study gathered in parts: a run appended twice, or changed, must not pass
    Mutant('per_seed_repeats_pass', 'docs/results_recomputed.py', "            if key(row) in keyed:\n",
           "            if False:\n",
           ('tests/test_docs.py::test_the_per_seed_readers_refuse_a_file_that_repeats_a_run_a_layer_or_a_batch',)),
    Mutant('appended_run_may_change', 'docs/results_recomputed.py',
           "if any(old[k][c] not in ('', new[k][c]) and new[k][c] != '' for c in old_fields if c != 'seconds'):",
           "if False:", ('tests/test_docs.py::test_a_later_report_is_appended_to_a_studys_files_in_the_reports_order_'
                         'and_never_changes_a_run',)),
    Mutant('appended_run_unplanned', 'docs/results_recomputed.py', "for k in new if k[:3] not in planned)",
           "for k in new if k[:3] in ())", ('tests/test_docs.py::test_a_later_report_is_appended_to_a_studys_files_'
                                            'in_the_reports_order_and_never_changes_a_run',)),
    Mutant('figure_mixes_settings', 'docs/results_recomputed.py',
           "(comparison_label(v, role), seed_pairs(runs, setting, v, 'attention'))",
           "(comparison_label(v, role), seed_pairs(runs, next(iter(runs))[0], v, 'attention'))",
           ('tests/test_docs.py::test_the_per_seed_figure_draws_each_variant_minus_attention_by_seed_from_the_'
            'published_file',)),
    Mutant('one_seed_cell_in_its_family', 'docs/results_recomputed.py',
           "keys = [k for k in tests if family_of(k) == name and math.isfinite(tests[k].p)]",
           "keys = [k for k in tests if family_of(k) == name]",
           ('tests/test_docs.py::test_a_per_seed_file_is_recomputed_exactly_paired_by_seed_with_holm_over_the_studys_'
            'family',)),
    Mutant('fit_words_df_of_the_pairs', 'docs/results_recomputed.py', 'f"({pairs} pairs, t on {pairs - 2} df)"',
           'f"({pairs} pairs, t on {pairs - 1} df)"',
           ('tests/test_docs.py::test_a_fits_words_name_its_degrees_of_freedom_and_what_its_weighted_means_are_of',)),
    Mutant('previous_eval_is_the_last', 'lab/reports.py', "val_loss_previous_eval=repr(run['log'][-2]['val_loss'])",
           "val_loss_previous_eval=repr(run['log'][-1]['val_loss'])",
           ('tests/test_sweep.py::test_the_settled_corridor_study_reports_its_named_tests_and_publishes_every_seed',)),
    # promises at their edges: a check's boundary, what a resume carries, which keys a form reads, the device
    Mutant('token_id_check_off_by_one', 'sources.py', "if largest >= meta['vocab_size']:",
           "if largest > meta['vocab_size']:", k('test_train.py', 'equal_to_vocab_size')),
    Mutant('resume_seconds_from_zero', 'run.py', "progress['seconds'] = ckpt.get('seconds', 0.0)",
           "progress['seconds'] = 0.0", k('test_train.py', 'elapsed_seconds')),
    Mutant('ignored_operator_key_accepted', 'common.py', "(ignored and not saved, f\"operator=", "(False, f\"operator=",
           k('test_common.py', 'does_not_read')),
    Mutant('missing_model_arg_refused', 'lab/file_checks.py',
           "    args.update({key: config.get(key, fields[key].default) for",
           "    if missing:\n        raise ValueError('lacks a key')\n    args.update({key: config.get(key, fields[key].default) for",
           k('test_train.py', 'before_a_model_key_existed')),
    Mutant('label_smoothing_dropped', 'train.py', "**({'label_smoothing': cfg.label_smoothing} if cfg.label_smoothing else {})",
           "**{}", k('test_train.py', 'label_smoothing_reaches')),
    Mutant('mps_not_synchronised', 'common.py', "    elif device.startswith('mps'):\n        torch.mps.synchronize()",
           "    elif device.startswith('mps'):\n        pass", k('test_common.py', 'on_mps')),
    Mutant('absent_checkpoint_named', 'run.py', "    if not os.path.isfile(path):\n        return None,",
           "    if False:\n        return None,", k('test_train.py', 'saved_nothing')),
    Mutant('model_key_newer_than_the_file_takes_the_default', 'lab/file_checks.py',
           "config.get(key, fields[key].default) for key in missing", "fields[key].default for key in missing",
           k('test_sources.py', 'newer_than_the_checkpoint')),
    # a key the user set is honoured or refused whatever its value; every printed command does what it says
    Mutant('a_key_set_to_its_default_is_unset', 'common.py', "        given.add(key)\n", "",
           ('tests/test_train.py', '-k', 'corridor_run_folder_keeps or keeps_their_shape or where_init_from_does_not_read',
            'tests/test_sample.py')),
    Mutant('run_folder_key_judged_by_value', 'run.py', "wrong = [k for k in own if k in given and getattr(cfg, k) != saved[k]]",
           "wrong = [k for k in own if getattr(cfg, k) != OPERATOR_DEFAULTS[k] and getattr(cfg, k) != saved[k]]",
           k('test_train.py', 'corridor_run_folder_keeps')),
    Mutant('weights_shape_replaces_a_set_key', 'train.py',
           "wrong = [key for key, value in shape.items() if key in given and getattr(cfg, key) != value]",
           "wrong = []", k('test_train.py', 'keeps_their_shape')),
    Mutant('next_commands_blind_to_the_other_run', 'run.py',
           "partner = next((f for f in folders if operator_held(f, cfg.dataset) not in (None, cfg.operator)), None)",
           "partner = None", k('test_run.py', 'see_the_other_run')),
    Mutant('next_commands_after_a_run_folder_start', 'run.py',
           "if resumed or cfg.train_only != 'all' or os.path.isfile(os.path.join(cfg.init_from, 'ckpt.pt')):",
           "if resumed or cfg.train_only != 'all':", k('test_run.py', 'see_the_other_run')),
    Mutant('run_without_checkpoint_needs_one', 'sources.py', "    if not os.path.isfile(path):\n        if not is_run_folder",
           "    if False:\n        if not is_run_folder", k('test_analyze.py', 'saved_no_checkpoint')),
    Mutant('run_folder_taken_for_a_transformers_folder', 'sources.py', "    if is_run_folder(source):  # its config.json",
           "    if False:  # its config.json", k('test_sample.py', 'saved_no_checkpoint')),
]


def copy_repo(destination):
    """The tracked files and the untracked ones git does not ignore (new tests), and ../shared beside them."""
    listed = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split('\0')
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    shared = REPO.parent / 'shared'
    if shared.is_dir():
        (destination.parent / 'shared').symlink_to(shared)


def run_tests(copy, tests):
    # no .pyc: a mutant and the restored original can share a size and an mtime second; -n 0: a handful of tests
    # in one process, without pytest.ini's worker processes to start
    env = {**os.environ, 'PYTHONDONTWRITEBYTECODE': '1'}
    result = subprocess.run([sys.executable, '-m', 'pytest', '-x', '-q', '-n', '0', '-p', 'no:cacheprovider', *tests],
                            cwd=copy, capture_output=True, text=True, env=env, timeout=1200)
    return result.returncode, (result.stdout + result.stderr).strip().splitlines()[-3:]


def check(mutant, copy):
    """('killed' | 'SURVIVED' | 'ERROR', detail)."""
    path = copy / mutant.file
    if not path.is_file():
        return 'ERROR', f"no file {mutant.file}"
    source = path.read_text()
    count = source.count(mutant.original)
    if count != 1:
        return 'ERROR', f"the snippet occurs {count} times in {mutant.file}: {mutant.original!r}"
    path.write_text(source.replace(mutant.original, mutant.replacement))
    try:
        code, tail = run_tests(copy, mutant.tests)
    finally:
        path.write_text(source)
    if code == 1:
        return 'killed', tail[-1] if tail else ''
    if code == 0:
        return 'SURVIVED', tail[-1] if tail else ''
    return 'ERROR', f"pytest exit status {code} (5: no test selected): {' / '.join(tail)}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--list', action='store_true', help="print the mutants and their tests, run nothing")
    parser.add_argument('--only', default='', help="comma-separated mutant names")
    parser.add_argument('--baseline', action='store_true', help="first run each selection on the unmutated copy")
    args = parser.parse_args()
    chosen = MUTANTS
    if args.only:
        names = args.only.split(',')
        unknown = [n for n in names if n not in {m.name for m in MUTANTS}]
        if unknown:
            sys.exit(f"error: unknown mutant(s) {', '.join(unknown)} (see --list)")
        chosen = [m for m in MUTANTS if m.name in names]
    if args.list:
        for m in chosen:
            print(f"{m.name:34s} {m.file:10s} {' '.join(m.tests)}")
        return
    start = time.time()
    with tempfile.TemporaryDirectory(prefix='mutants-') as tmp:
        copy = Path(tmp) / 'repo'
        copy_repo(copy)
        broken = set()
        if args.baseline:
            for tests in dict.fromkeys(m.tests for m in chosen):
                code, tail = run_tests(copy, tests)
                if code != 0:
                    broken.add(tests)
                    print(f"baseline fails: {' '.join(tests)}: {' / '.join(tail)}", flush=True)
        results = []
        for m in chosen:
            t0 = time.time()
            outcome, detail = ('ERROR', 'its tests fail without the mutation') if m.tests in broken else check(m, copy)
            results.append(outcome)
            print(f"{outcome:8s} {m.name:34s} {time.time() - t0:5.0f} s  {detail}", flush=True)
    killed, survived = results.count('killed'), results.count('SURVIVED')
    print(f"mutation score: {killed}/{killed + survived} killed, {survived} survived, {results.count('ERROR')} "
          f"error(s), {len(results)} mutants, {time.time() - start:.0f} s")
    sys.exit(0 if killed == len(results) else 1)


if __name__ == '__main__':
    main()
