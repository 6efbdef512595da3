"""An image-pyramid pipeline over frames of changing resolution: arrays of
changing sizes, within a frame (each level a quarter of the one above) and
across frames (every frame has its own size).

Per frame: a synthetic image is generated on the device; each of ``LEVELS``
levels is a 3x3 binomial blur (edges clamped) into a new array and a 2x2
box downsample into another; then, from the coarsest level up, each level
is upsampled (nearest), subtracted from the finer one (a Laplacian band)
and the band's energy summed into a fresh accumulator. The check compares
the band energies with NumPy's, for every frame of at most
``FULL_CHECK_PIXELS`` pixels and for the last frame.

Out of memory stops the pipeline.
"""

import math

import numpy as np
from numba import cuda

NAME = "stencil"
FRAMES = 12
SIMULATOR_STEPS = 3
LEVELS = 3
FULL_CHECK_PIXELS = 1 << 20
ON_OUT_OF_MEMORY = "stops"
_ALIGN = 2 << LEVELS            # every level's sides stay even


def frame_sizes(scale, frames, seed=0):
    """(height, width) of each frame: up to 8192 x 8192 float32 (256 MiB) at
    scale 1, each side drawn in [1/2, 1] of that, a multiple of 16."""
    side = max(32, round(8192 * math.sqrt(scale)))
    rng = np.random.default_rng(seed)
    draws = rng.uniform(0.5, 1.0, size=(frames, 2))
    return [tuple(max(_ALIGN, int(side * u) // _ALIGN * _ALIGN) for u in pair) for pair in draws]


def synthesize(img, frame):
    """img[i, j] = ((31 i + 17 j + 7 frame) mod 256) / 255."""
    i0, j0 = cuda.grid(2)
    si, sj = cuda.gridsize(2)
    for i in range(i0, img.shape[0], si):
        for j in range(j0, img.shape[1], sj):
            img[i, j] = ((31 * i + 17 * j + 7 * frame) % 256) / 255.0


def blur(out, img):
    """3x3 binomial blur (weights 1 2 1 / 4 per axis), edges clamped."""
    i0, j0 = cuda.grid(2)
    si, sj = cuda.gridsize(2)
    h, w = img.shape
    for i in range(i0, h, si):
        up, down = max(i - 1, 0), min(i + 1, h - 1)
        for j in range(j0, w, sj):
            left, right = max(j - 1, 0), min(j + 1, w - 1)
            row_up = img[up, left] + 2 * img[up, j] + img[up, right]
            row = img[i, left] + 2 * img[i, j] + img[i, right]
            row_down = img[down, left] + 2 * img[down, j] + img[down, right]
            out[i, j] = (row_up + 2 * row + row_down) / 16


def downsample(out, img):
    """out[i, j] = mean of img[2i:2i+2, 2j:2j+2]."""
    i0, j0 = cuda.grid(2)
    si, sj = cuda.gridsize(2)
    for i in range(i0, out.shape[0], si):
        for j in range(j0, out.shape[1], sj):
            out[i, j] = 0.25 * (img[2 * i, 2 * j] + img[2 * i + 1, 2 * j]
                                + img[2 * i, 2 * j + 1] + img[2 * i + 1, 2 * j + 1])


def upsample(out, coarse):
    """Nearest-neighbour upsampling by 2."""
    i0, j0 = cuda.grid(2)
    si, sj = cuda.gridsize(2)
    for i in range(i0, out.shape[0], si):
        for j in range(j0, out.shape[1], sj):
            out[i, j] = coarse[i // 2, j // 2]


def subtract(out, a, b):
    """out = a - b."""
    i0, j0 = cuda.grid(2)
    si, sj = cuda.gridsize(2)
    for i in range(i0, out.shape[0], si):
        for j in range(j0, out.shape[1], sj):
            out[i, j] = a[i, j] - b[i, j]


def sum_of_squares(acc, x):
    """acc[0] += sum of x[i, j]^2."""
    i0, j0 = cuda.grid(2)
    si, sj = cuda.gridsize(2)
    partial = 0.0
    for i in range(i0, x.shape[0], si):
        for j in range(j0, x.shape[1], sj):
            partial += x[i, j] * x[i, j]
    cuda.atomic.add(acc, 0, partial)


def reference_energies(shape, frame):
    """NumPy's band energies of a frame, finest first."""
    i = np.arange(shape[0], dtype=np.int32)[:, None]
    j = np.arange(shape[1], dtype=np.int32)[None, :]
    level = (((31 * i + 17 * j + 7 * frame) % 256) / 255.0).astype(np.float32)
    pyramid = [level]
    for _ in range(LEVELS):
        p = np.pad(pyramid[-1], 1, mode="edge")
        rows = p[:, :-2] + 2 * p[:, 1:-1] + p[:, 2:]
        blurred = (rows[:-2] + 2 * rows[1:-1] + rows[2:]) / 16
        h, w = blurred.shape
        pyramid.append(blurred.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3), dtype=np.float32))
    energies = []
    for fine, coarse in zip(pyramid, pyramid[1:]):
        up = np.repeat(np.repeat(coarse, 2, axis=0), 2, axis=1)
        energies.append(float(np.sum((fine.astype(np.float64) - up) ** 2)))
    return energies


def _pyramid(arrays, shape, frame):
    """The frame's levels, finest first (the caller frees them)."""
    level = arrays.empty(shape)
    arrays.launch(synthesize, shape, level, frame)
    levels = [level]
    for _ in range(LEVELS):
        blurred = arrays.empty(level.shape)
        arrays.launch(blur, level.shape, blurred, level)
        level = arrays.empty((level.shape[0] // 2, level.shape[1] // 2))
        arrays.launch(downsample, level.shape, level, blurred)
        arrays.free(blurred)
        levels.append(level)
    return levels


def _band_energies(arrays, levels):
    """Each band's energy, finest first (None when the arrays hold no data)."""
    energies = []
    for fine, coarse in zip(levels, levels[1:]):
        up = arrays.empty(fine.shape)
        arrays.launch(upsample, fine.shape, up, coarse)
        band = arrays.empty(fine.shape)
        arrays.launch(subtract, fine.shape, band, fine, up)
        arrays.free(up)
        acc = arrays.to_device(np.zeros(1))
        arrays.launch(sum_of_squares, fine.shape, acc, band)
        arrays.free(band)
        value = arrays.to_host(acc)
        arrays.free(acc)
        energies.append(None if value is None else float(value[0]))
    return energies


def run(arrays, scale, steps=FRAMES):
    """Process ``steps`` frames; raises AssertionError when a checked frame's
    band energies differ from NumPy's."""
    sizes = frame_sizes(scale, steps)
    for frame, shape in enumerate(sizes):
        levels = _pyramid(arrays, shape, frame)
        energies = _band_energies(arrays, levels)
        for level in levels:
            arrays.free(level)
        if arrays.computes and (frame == steps - 1 or shape[0] * shape[1] <= FULL_CHECK_PIXELS):
            with arrays.untimed():
                np.testing.assert_allclose(energies, reference_energies(shape, frame), rtol=1e-4,
                                           err_msg=f"stencil: frame {frame} {shape}")
        arrays.checkpoint()
