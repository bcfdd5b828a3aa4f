"""
Weights & Biases for a run with --wandb_log=True, one job: a W&B run in the run folder (out_dir/wandb), resumed with
it, that gets what log.jsonl gets at each evaluation (as flat metrics) and each log line's loss and learning rate.
run.open_run_folder imports this module before it claims the folder (without the package: one line, no train.lock)
and returns it to train.py, which logs through it and finishes it.
"""

import torch

from common import UserError
from model import in_corridor

try:
    import wandb
except ImportError:
    raise UserError("wandb_log=True needs the wandb package: pip install wandb (or --wandb_log=False)") from None


def start(cfg, resumed):
    wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=vars(cfg), dir=cfg.out_dir,
               resume='allow' if resumed else None)


def evaluation(entry):
    """A log.jsonl entry at its iteration: losses, lr, tokens, occupancy, every head's scalars, the walk."""
    metrics = {'train/loss': entry['train_loss'], 'val/loss': entry['val_loss'], 'val/best': entry['best_val_loss'],
               'lr': entry['lr'], 'tokens': entry['tokens'],
               'corridor/occupancy': in_corridor(torch.tensor(entry['gamma'])).float().mean().item()}
    metrics |= {f'{key}/L{layer}H{head}': value for key in ('gamma', 'delta', 'c_I', 'c_P')
                for layer, heads in enumerate(entry[key]) for head, value in enumerate(heads)}
    metrics |= {f'walk_{part}/{key}/L{layer}': value for part, diagnostics in entry.get('walk', {}).items()
                for key, values in diagnostics.items() for layer, value in enumerate(values)}
    wandb.log(metrics, step=entry['iter'])


def log_line(iter_num, loss, lr):
    """A console log line's window loss and learning rate."""
    wandb.log({'train/loss_window': loss, 'lr': lr}, step=iter_num)


def finish():
    wandb.finish()
