"""The training loss of the author's recipe for one micro-batch: reconstruction, distillation of
the teacher's latents, the decoder on the teacher's latents, and the adversarial correction."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from trainer.config import TrainConfig
from trainer.model import reconstruction_target
from trainer.teacher import encode

if TYPE_CHECKING:
    from trainer.learner import Learner

# the recipe's losses (step events carry them by name; TensorBoard gets them as train/<name>)
RECIPE_METRICS = ("distill_loss", "decoder_teacher_loss", "adv_g_loss", "adv_d_loss")


class RecipeLoss:
    def __init__(self, cfg: TrainConfig, learner: Learner):
        self.cfg = cfg
        self.learner = learner
        # (fake, real, condition) of the last micro-batch, detached: the discriminator's step input
        self.adv_inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def __call__(
        self, x: torch.Tensor, t_lat: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Total loss and its parts for one micro-batch x (N×T×3×H×W in [0, 1]); t_lat: the teacher's
        latents read from the cache (None: the online teacher encodes x, when the run distils)."""
        cfg, learner = self.cfg.loss, self.learner
        z, y = learner.engine(x, clamp=False)  # the loss pulls back pixels outside [0, 1] too
        recon = F.mse_loss(y.float(), reconstruction_target(x, y.shape[1]).float())
        total = cfg.recon_weight * recon
        parts = {"recon_loss": recon.detach()}
        fake, cond = y, z
        if t_lat is None and learner.teacher is not None:
            family = self.cfg.model.family
            t_lat = encode(learner.teacher, x, family, learner.module.t_upscale).to(x.dtype)
        if t_lat is not None:
            t_lat = t_lat.to(z.dtype)
            enc = F.mse_loss(z.float(), t_lat.float())
            total = total + cfg.distill_encoder_weight * enc
            parts["distill_loss"] = enc.detach()
            cond = t_lat
            if cfg.decoder_on_teacher_latents:
                y_t = learner.module.decode(t_lat, clamp=False)
                dec = F.mse_loss(y_t.float(), reconstruction_target(x, y_t.shape[1]).float())
                total = total + dec
                parts["decoder_teacher_loss"] = dec.detach()
                fake = y_t
        if learner.adversary is not None:
            # the decoder's adversarial correction, on what it decodes from the teacher's latents when
            # the recipe trains it on them (the author's), else on its own reconstruction
            real = reconstruction_target(x, fake.shape[1])
            adv = learner.adversary.generator_loss(fake, real, cond)
            total = total + self.cfg.adversarial.weight * adv
            parts["adv_g_loss"] = adv.detach()
            self.adv_inputs = (fake.detach(), real.detach(), cond.detach())
        return total, parts
