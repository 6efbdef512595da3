"""The corpus's diffusion and graph workloads: diffusers' UNets built from
their configurations (random weights, nothing downloaded), trained and
sampled; graph networks (PyTorch Geometric) on random graphs of varying
size. Registered in corpus_workloads.WORKLOADS (its docstring says how a
workload is made and recorded)."""

import torch
from torch import nn
from torch.nn import functional as F

from corpus_workloads import adam, adamw, to_device, train_step, workload


# -- diffusion ---------------------------------------------------------------------------------

@workload("ddpm-train", "diffusion",
          "diffusers UNet2DModel from a config (64-256 channels, 4 levels, attention at the "
          "third), DDPM noise-prediction training, AdamW, batches of 8 images in aspect-ratio "
          "buckets (64x64, 48x80, 80x48, 56x72, 72x56) drawn per step, 10 steps")
def ddpm_train(shapes, data):
    from diffusers import DDPMScheduler, UNet2DModel
    model = UNet2DModel(sample_size=64, block_out_channels=(64, 128, 256, 256), layers_per_block=1,
                        down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D",
                                          "DownBlock2D"),
                        up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D"))
    scheduler = DDPMScheduler(num_train_timesteps=1000)
    inputs = []
    for _ in range(10):
        h, w = shapes.choice(((64, 64), (48, 80), (80, 48), (56, 72), (72, 56)))
        inputs.append((torch.randn(8, 3, h, w, generator=data),
                       torch.randn(8, 3, h, w, generator=data),
                       torch.randint(0, 1000, (8,), generator=data)))

    def run(model, inputs):
        model.train()
        opt = adamw(model)
        for images, noise, steps in inputs:
            images, noise, steps = to_device(images), to_device(noise), to_device(steps)
            noisy = scheduler.add_noise(images, noise, steps)
            loss = F.mse_loss(model(noisy, steps).sample, noise)
            train_step(opt, loss)
    return model, inputs, run


@workload("sd-unet-sample", "diffusion",
          "diffusers UNet2DConditionModel from a config (Stable Diffusion's shape, smaller: "
          "64-256 channels, 3 levels, cross-attention to 77 text tokens of width 256), DDIM "
          "sampling of 10 steps with classifier-free guidance, 6 requests of 1-8 images "
          "whose latent size is drawn from 32, 48 or 64")
def sd_unet_sample(shapes, data):
    from diffusers import DDIMScheduler, UNet2DConditionModel
    model = UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, block_out_channels=(64, 128, 256),
        layers_per_block=1, cross_attention_dim=256, attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"))
    scheduler = DDIMScheduler(num_train_timesteps=1000)
    inputs = []
    for _ in range(6):
        n, size = shapes.randint(1, 8), shapes.choice((32, 48, 64))
        inputs.append((torch.randn(n, 4, size, size, generator=data),
                       torch.randn(2 * n, 77, 256, generator=data)))    # prompts, then empty

    def run(model, inputs):
        model.eval()
        images = []
        with torch.inference_mode():
            for latents, text in inputs:
                latents, text = to_device(latents), to_device(text)
                scheduler.set_timesteps(10)
                for t in scheduler.timesteps:
                    both = model(torch.cat([latents, latents]), t,
                                 encoder_hidden_states=text).sample
                    conditioned, unconditioned = both.chunk(2)
                    guided = unconditioned + 7.5 * (conditioned - unconditioned)
                    latents = scheduler.step(guided, t, latents).prev_sample
                images.append(latents.mean().item())
    return model, inputs, run


# -- graphs ------------------------------------------------------------------------------------

class GCN(nn.Module):
    """A 3-layer GCN (Kipf and Welling) for node classification."""

    def __init__(self, features=128, width=256, classes=40):
        super().__init__()
        from torch_geometric.nn import GCNConv
        self.convs = nn.ModuleList([GCNConv(features, width), GCNConv(width, width),
                                    GCNConv(width, classes)])

    def forward(self, x, edges):
        for i, conv in enumerate(self.convs):
            x = conv(x, edges)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), 0.5, self.training)
        return x


@workload("gcn-train", "graph network",
          "a 3-layer GCN (PyTorch Geometric's GCNConv, width 256) for node classification on "
          "random sampled subgraphs of 2,000-20,000 nodes (drawn per step), average degree "
          "10, 128 features, 40 classes, Adam, 12 steps")
def gcn_train(shapes, data):
    inputs = []
    for _ in range(12):
        n = shapes.randint(2000, 20000)
        inputs.append((torch.randn(n, 128, generator=data),
                       torch.randint(0, n, (2, 10 * n), generator=data),
                       torch.randint(0, 40, (n,), generator=data)))

    def run(model, inputs):
        model.train()
        opt = adam(model)
        for x, edges, labels in inputs:
            x, edges, labels = to_device(x), to_device(edges), to_device(labels)
            train_step(opt, F.cross_entropy(model(x, edges), labels))
    return GCN(), inputs, run


class GAT(nn.Module):
    """A 3-layer GAT (Velickovic et al., 4 heads of 64) with mean pooling,
    for graph classification."""

    def __init__(self, features=32, width=64, heads=4, classes=10):
        super().__init__()
        from torch_geometric.nn import GATConv
        self.convs = nn.ModuleList([GATConv(features, width, heads),
                                    GATConv(width * heads, width, heads),
                                    GATConv(width * heads, width, heads)])
        self.head = nn.Linear(width * heads, classes)

    def forward(self, x, edges, graph):
        from torch_geometric.nn import global_mean_pool
        for conv in self.convs:
            x = F.elu(conv(x, edges))
        return self.head(global_mean_pool(x, graph))


def molecule_batch(shapes, data, graphs):
    """Node features, edges (both ways, about 1.1 a node each way) and
    each node's graph of ``graphs`` random molecule-like graphs of 10-40
    nodes, batched as PyTorch Geometric batches them."""
    sizes = [shapes.randint(10, 40) for _ in range(graphs)]
    first = torch.tensor([0] + sizes[:-1]).cumsum(0)
    edges = []
    for start, n in zip(first.tolist(), sizes):
        chain = torch.arange(start, start + n - 1)
        extra = torch.randint(start, start + n, (2, n // 10 + 1), generator=data)
        edges += [torch.stack([chain, chain + 1]), extra]
    edges = torch.cat(edges, 1)
    return (torch.randn(sum(sizes), 32, generator=data), torch.cat([edges, edges.flip(0)], 1),
            torch.repeat_interleave(torch.arange(graphs), torch.tensor(sizes)),
            torch.randint(0, 10, (graphs,), generator=data))


@workload("gat-train", "graph network",
          "a 3-layer GAT (PyTorch Geometric's GATConv, 4 heads of 64) with mean pooling for "
          "graph classification, batches of 64-512 molecule-like graphs of 10-40 nodes "
          "(drawn per step), Adam, 12 steps")
def gat_train(shapes, data):
    inputs = [molecule_batch(shapes, data, shapes.randint(64, 512)) for _ in range(12)]

    def run(model, inputs):
        model.train()
        opt = adam(model)
        for x, edges, graph, labels in inputs:
            x, edges, graph, labels = to_device(x), to_device(edges), to_device(graph), \
                to_device(labels)
            train_step(opt, F.cross_entropy(model(x, edges, graph), labels))
    return GAT(), inputs, run
