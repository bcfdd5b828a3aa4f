"""What the checkpoint checksums cost: a 45M-parameter GPT's weights and AdamW moments (538 MB).
The checksums are the CRC-32 torch.save writes beside each record of its zip (on by default); corridor-gpt adds none
of its own, so a save costs what it costs. This measures, medians of six, interleaved:
  - a durable save (common.save_checkpoint) with torch's CRC-32 on (the default) and off: what the CRC costs a save,
    and the same into memory (io.BytesIO), without the disk's noise;
  - a load for sampling (sources.load_checkpoint, purpose 'model': every record's CRC-32 checked, the schema, the
    weights finite) against torch.load alone (memory-mapped, nothing checked).
Run from the repo root: python docs/checksum_cost.py (writes and leaves ./ckpt_cost.pt)."""
import io, statistics, sys, time
import torch
import torch.utils.serialization.config as serialization
sys.path.insert(0, '.')
from common import save_checkpoint
from model import GPT, GPTConfig
from sources import load_checkpoint

torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=6, n_head=8, n_embd=512, block_size=256, vocab_size=50257, operator='corridor'))
opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))[1].backward(); opt.step()
state = dict(model=model.state_dict(), optimizer=opt.state_dict(), model_args=vars(model.config), config={},
             meta=dict(tokenizer='gpt2', vocab_size=50257), iter_num=1)


def timed(f):
    t0 = time.perf_counter(); f(); return time.perf_counter() - t0


def save(crc, to_memory=False):
    with serialization.patch({'save.compute_crc32': crc}):
        torch.save(state, io.BytesIO()) if to_memory else save_checkpoint(state, 'ckpt_cost.pt')


times = {name: [] for name in ('save, no CRC', 'save (CRC, the default)', 'in memory, no CRC', 'in memory (CRC)',
                               'torch.load (mmap)', 'load_checkpoint')}
for i in range(6):
    for crc in (i % 2 == 1, i % 2 == 0):  # alternating which goes first (a save replaces the file the other wrote)
        times['save (CRC, the default)' if crc else 'save, no CRC'].append(timed(lambda: save(crc)))
        times['in memory (CRC)' if crc else 'in memory, no CRC'].append(timed(lambda: save(crc, to_memory=True)))
    times['torch.load (mmap)'].append(timed(lambda: torch.load('ckpt_cost.pt', weights_only=True, mmap=True)))
    times['load_checkpoint'].append(timed(lambda: load_checkpoint('ckpt_cost.pt', purpose='model', mmap=True)))
median = {name: statistics.median(t) for name, t in times.items()}
print(' | '.join(f"{name} {m:.3f}s" for name, m in median.items()))
print(f"a save with the CRC / without: {median['save (CRC, the default)'] / median['save, no CRC']:.3f} "
      f"(in memory {median['in memory (CRC)'] / median['in memory, no CRC']:.3f}); "
      f"corridor-gpt's own addition to a save: none; "
      f"load_checkpoint - torch.load: {median['load_checkpoint'] - median['torch.load (mmap)']:.3f}s")
