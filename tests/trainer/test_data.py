"""The data path on real video files: sources, split, clip sampling (frame-exact), bad videos,
the resumable sampler and the loader with worker processes."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from trainer import data
from trainer.augment import to_model_input
from trainer.config import DataSection
from trainer.data import (
    DataSourceError,
    ResumableSampler,
    VideoClipDataset,
    collate_clips,
    find_videos,
    make_train_loader,
    read_frames,
    split_train_val,
    validation_items,
)
from trainer.synthetic import VideoCodec, make_synthetic, write_video

T, H, W = 8, 32, 48  # H != W on purpose: crops and resizes must not assume squares


def cfg(**overrides) -> DataSection:
    base = {
        "frames": T,
        "height": H,
        "width": W,
        "min_delta": 1,
        "max_delta": 2,
        "num_workers": 0,
        "max_skip_per_item": 4,
    }
    return DataSection(**{**base, **overrides})


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[Path]:
    # 48x64 sources: a different aspect ratio from the 32x48 target, so every clip is cropped.
    return make_synthetic(tmp_path_factory.mktemp("clips"), clips=5, frames=20, height=48, width=64)


def numbered_frames(n: int, height: int = 32, width: int = 64):
    """Frame i shows i in two grey levels 16 apart (top half i // 16, bottom half i % 16): any
    decoding error of a few levels still reads back as the right number. Wider than H:W, so that a
    full-scale crop keeps the whole height and both halves stay where frame_numbers looks."""
    for i in range(n):
        frame = np.empty((height, width, 3), np.uint8)
        frame[: height // 2] = 16 * (i // 16) + 8
        frame[height // 2 :] = 16 * (i % 16) + 8
        yield frame


def frame_numbers(video: np.ndarray | torch.Tensor) -> list[int]:
    """Inverse of numbered_frames for [N, H, W, 3] arrays or [N, 3, H, W] tensors."""
    if isinstance(video, torch.Tensor):
        video = video.permute(0, 2, 3, 1).numpy()
    h = video.shape[1]
    high = video[:, h // 4, :, 0].astype(float).mean(1)
    low = video[:, 3 * h // 4, :, 0].astype(float).mean(1)
    return [16 * round((a - 8) / 16) + round((b - 8) / 16) for a, b in zip(high, low)]


# Default x264 settings use B-frames (frames decoded out of order), as most real mp4s do; a short
# GOP gives the seek something to land on.
MP4_BFRAMES = VideoCodec("libx264", "mp4", ".mp4", {"crf": "0"})
MKV_NO_COUNT = VideoCodec("libx264", "matroska", ".mkv", {"crf": "0"})  # Matroska stores no frame count


@pytest.fixture(scope="module")
def numbered(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("numbered")
    return {
        codec.suffix: write_video(
            folder / f"numbered{codec.suffix}", numbered_frames(120), codec=codec, gop=10
        )
        for codec in (MP4_BFRAMES, MKV_NO_COUNT)
    }


def write_corrupt(path: Path) -> Path:
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    return path


# --- sources -------------------------------------------------------------------------------------


def test_find_videos_scans_a_tree(tmp_path):
    for rel in ["b/2.mp4", "a/x/1.MKV", "a/0.webm", "c.mov", "d.m4v", "e.avi"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    for rel in ["notes.txt", "a/._0.webm", ".hidden/3.mp4", "b/.2.mp4.part"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    found = find_videos(str(tmp_path))
    assert [p.relative_to(tmp_path).as_posix() for p in found] == sorted(
        ["a/0.webm", "a/x/1.MKV", "b/2.mp4", "c.mov", "d.m4v", "e.avi"]
    )
    assert find_videos(str(tmp_path)) == found


def test_find_videos_follows_links_without_looping(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.mp4").write_bytes(b"")
    (tmp_path / "real" / "loop").symlink_to(tmp_path / "real")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "linked").symlink_to(tmp_path / "real")
    assert find_videos(str(tmp_path / "data")) == [tmp_path / "data" / "linked" / "a.mp4"]


def test_find_videos_from_annotation_json(tmp_path, clips):
    videos = tmp_path / "videos"
    shutil.copytree(clips[0].parent, videos / "set")
    listing = {"list": [{"path": f"set/{p.name}", "cap": ["ignored"]} for p in reversed(clips)]}
    (videos / "train.json").write_text(json.dumps(listing))
    expected = sorted(videos / "set" / p.name for p in clips)
    assert find_videos(str(videos / "train.json")) == expected
    # With an explicit root the JSON can live anywhere.
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "train.json").write_text(json.dumps(listing))
    assert find_videos(str(tmp_path / "meta" / "train.json"), root=str(videos)) == expected


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.json", "{not json", "not a valid annotation JSON"),
        ("nolist.json", json.dumps({"videos": []}), 'no top-level "list"'),
        ("empty.json", json.dumps({"list": []}), "lists no videos"),
        ("nopath.json", json.dumps({"list": [{"file": "a.mp4"}]}), r'list\[0\] has no "path"'),
        ("missing.json", json.dumps({"list": [{"path": "nowhere/a.mp4"}]}), "check data.root"),
    ],
)
def test_find_videos_rejects_bad_annotations(tmp_path, name, content, message):
    source = tmp_path / name
    source.write_text(content)
    with pytest.raises(DataSourceError, match=message) as err:
        find_videos(str(source))
    assert str(source) in str(err.value)


def test_find_videos_rejects_missing_and_empty_sources(tmp_path):
    with pytest.raises(DataSourceError, match="does not exist") as err:
        find_videos(str(tmp_path / "nope"))
    assert str(tmp_path / "nope") in str(err.value)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no videos here")
    with pytest.raises(DataSourceError, match="no video files found") as err:
        find_videos(str(tmp_path / "empty"))
    assert str(tmp_path / "empty") in str(err.value)
    with pytest.raises(DataSourceError, match="data.source is empty"):
        find_videos("")
    (tmp_path / "a.json").write_text(json.dumps({"list": [{"path": "a.mp4"}]}))
    with pytest.raises(DataSourceError, match="not a folder"):
        find_videos(str(tmp_path / "a.json"), root=str(tmp_path / "nope"))


# --- split ---------------------------------------------------------------------------------------


def test_split_is_deterministic_and_sized():
    paths = [Path(f"/data/set/clip-{i:03d}.mp4") for i in range(50)]
    train, val = split_train_val(paths, 0.1, 64)
    assert (train, val) == split_train_val(list(paths), 0.1, 64)
    assert len(val) == 5 and len(train) == 45
    assert sorted(train + val) == paths
    assert train == sorted(train) and val == sorted(val)
    assert len(split_train_val(paths, 0.5, 3)[1]) == 3


def test_split_survives_moving_the_dataset():
    names = [f"sub{i % 3}/clip-{i:03d}.mp4" for i in range(40)]
    _, here = split_train_val([Path("/mnt/a/data") / n for n in names], 0.2, 64)
    _, there = split_train_val([Path("/scratch/copy") / n for n in names], 0.2, 64)
    assert [p.relative_to("/mnt/a/data") for p in here] == [p.relative_to("/scratch/copy") for p in there]


@pytest.mark.parametrize(
    "n, fraction, cap, n_val",
    [(1, 0.5, 64, 0), (10, 0.0, 64, 0), (10, 0.5, 0, 0), (2, 0.9, 64, 1), (3, 0.99, 64, 2)],
)
def test_split_edge_cases_keep_a_train_clip(n, fraction, cap, n_val):
    train, val = split_train_val([Path(f"/d/{i}.mp4") for i in range(n)], fraction, cap)
    assert len(val) == n_val and len(train) == n - n_val >= 1


# --- clips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("train", [True, False])
def test_clip_shape_and_type(clips, train):
    ds = VideoClipDataset(clips, cfg(), train=train)
    assert len(ds) == len(clips)
    out = ds[(2, 123)]
    assert out["video"].shape == (T, 3, H, W) and out["video"].dtype == torch.uint8
    assert out["index"] == 2 and out["skipped"] == []
    assert out["video"].float().std() > 5, "a textured clip, not a blank one"


def test_same_item_same_clip_different_seed_different_clip(clips):
    ds = VideoClipDataset(clips, cfg(), train=True)
    first = ds[(1, 99)]["video"]
    assert torch.equal(first, ds[(1, 99)]["video"])
    assert torch.equal(first, VideoClipDataset(clips, cfg(), train=True)[(1, 99)]["video"])
    others = [ds[(1, s)]["video"] for s in range(100, 104)]
    assert all(not torch.equal(first, o) for o in others)


def test_validation_is_fixed_centre_crop(clips):
    a = VideoClipDataset(clips, cfg(), train=False)[(3, 0)]["video"]
    b = VideoClipDataset(clips, cfg(), train=False)[(3, 777)]["video"]
    assert torch.equal(a, b), "validation must not depend on the seed"
    # The largest 32:48 region of a 48x64 frame is 43x64 (scale 0.75: a 36x48 view), centred:
    # rows 3..46 of the source (the view's rows 2..34), resized in uint8.
    source = torch.from_numpy(read_frames(clips[3], range(T))).permute(0, 3, 1, 2).float()
    expected = torch.nn.functional.interpolate(
        source[:, :, 3 : 3 + 43], size=(H, W), mode="bilinear", antialias=True, align_corners=False
    )
    assert (a.float() - expected).abs().max() <= 1, "uint8 resize within one level of the float one"


def test_jitter_and_flip_stay_within_bounds(clips):
    plain = VideoClipDataset(clips, cfg(flip=False, color_jitter=0.0, min_crop_scale=1.0), train=True)
    jittered = VideoClipDataset(clips, cfg(flip=False, color_jitter=0.2, min_crop_scale=1.0), train=True)
    a, b = plain[(0, 5)], jittered[(0, 5)]
    # The loader's clip is the same uint8 picture; only the factors it carries for the device differ.
    assert torch.equal(a["video"], b["video"])
    assert a["jitter"].tolist() == [1.0, 1.0, 1.0]
    assert all(0.8 <= f <= 1.2 for f in b["jitter"].tolist()) and b["jitter"].tolist() != [1.0, 1.0, 1.0]
    assert torch.equal(b["jitter"], jittered[(0, 5)]["jitter"]), "the factors come from the item's seed"
    x = to_model_input(a["video"][None], torch.float32)
    y = to_model_input(b["video"][None], torch.float32, b["jitter"][None])
    assert not torch.equal(x, y) and 0 <= y.min() and y.max() <= 1
    assert (x - y).abs().mean() < 0.2, "light jitter, not a different picture"
    flipping = VideoClipDataset(clips, cfg(flip=True, color_jitter=0.0, min_crop_scale=1.0), train=True)
    same = {torch.equal(flipping[(0, s)]["video"], plain[(0, s)]["video"]) for s in range(12)}
    assert same == {True, False}, "flip should happen for some seeds and not others"


# --- crops ---------------------------------------------------------------------------------------


def test_sources_smaller_than_the_crop_are_skipped_never_upsampled(tmp_path, clips):
    small = make_synthetic(tmp_path / "small", clips=1, frames=12, height=24, width=64)[0]
    ds = VideoClipDataset([small, clips[0]], cfg(), train=True)
    item = ds[(0, 1)]
    assert item["index"] == 1, "the next video stands in"
    (skip,) = item["skipped"]
    assert skip["path"] == str(small)
    assert (
        "24x64 are smaller than the 32x48 training crop" in skip["reason"]
        and "never upsampled" in skip["reason"]
    )


@pytest.mark.parametrize("train", [True, False])
def test_crops_never_zoom_past_the_source_pixels(train):
    # A source exactly the crop's size: the view is the source itself, whatever the zoom drawn.
    ds = VideoClipDataset([], cfg(min_crop_scale=0.3), train=train)
    for seed in range(50):
        box, _ = ds.augmentation(H, W, seed)
        assert box.view == (H, W) and (box.top, box.left) == (0, 0)
    # A larger one: training zooms in, down to but never past the source's own pixels.
    views = {ds.augmentation(3 * H, 3 * W, seed)[0].view for seed in range(200)}
    assert all(H <= v[0] <= 3 * H and W <= v[1] <= 3 * W for v in views)
    if train:
        assert len(views) > 20 and (H, W) in views
    else:
        assert views == {(H, W)}, "validation: the largest region, no zoom"


def test_frame_height_takes_crops_from_frames_at_that_height(tmp_path):
    src = make_synthetic(tmp_path, clips=1, frames=12, height=96, width=128)
    ds = VideoClipDataset(src, cfg(frame_height=48, min_crop_scale=1.0, flip=False), train=True)
    tops_lefts = set()
    for seed in range(6):
        item = ds[(0, seed)]
        top, left, view_h, view_w, flipped = item["crop"].tolist()
        assert (view_h, view_w, flipped) == (48, 64, 0), "96x128 scaled to 48 high, a 32x48 window of it"
        tops_lefts.add((top, left))
        frames = torch.from_numpy(read_frames(src[0], range(12))).permute(0, 3, 1, 2).float()
        view = torch.nn.functional.interpolate(frames, size=(48, 64), mode="bilinear", antialias=True)
        windows = view[:, :, top : top + H, left : left + W]
        first = item["video"][0].float()
        assert first.shape == (3, H, W)
        # resizing only the window's region gives the same picture as resizing the frame, up to edges;
        # the clip starts at a random frame, so look for it among all of them
        assert min((first - w)[:, 2:-2, 2:-2].abs().mean() for w in windows) < 3
    assert len(tops_lefts) > 1, "the window moves"
    with pytest.raises(ValueError, match="frame_height"):
        cfg(frame_height=H - 8)


def test_grid_aligned_crops_are_exact_windows_of_the_scaled_frame(tmp_path):
    src = make_synthetic(tmp_path, clips=1, frames=12, height=96, width=144)
    ds = VideoClipDataset(src, cfg(frame_height=64, min_crop_scale=0.5), train=True, crop_grid=8)
    seen = set()
    for seed in range(8):
        item = ds[(0, seed)]
        top, left, view_h, view_w, flipped = item["crop"].tolist()
        assert (view_h, view_w) == (64, 96), "a fixed scale: latents are cached at one"
        assert top % 8 == 0 and left % 8 == 0
        seen.add((top, left))
        frames = read_frames(src[0], range(12))
        view = data._resize_u8(frames, (64, 96))[:, :, top : top + H, left : left + W]
        if flipped:
            view = view.flip(-1)
        got = item["video"]
        assert got.shape == (T, 3, H, W)
        assert any(torch.equal(got[0], view[i]) for i in range(12)), "exactly a window of the scaled frame"
    assert len(seen) > 1


# --- frame accuracy ------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
@pytest.mark.parametrize("allow_seek", [True, False])
def test_read_frames_returns_exactly_the_requested_frames(numbered, suffix, allow_seek):
    wanted = [0, 1, 2, 47, 50, 77, 78, 99, 119]
    assert frame_numbers(read_frames(numbered[suffix], wanted, allow_seek)) == wanted
    late = list(range(90, 120, 3))
    assert frame_numbers(read_frames(numbered[suffix], late, allow_seek)) == late


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_seek_really_seeks(numbered, suffix):
    container, stream = data._open_video(numbered[suffix])
    with container:
        first_index, _ = next(data._frames_after_seek(container, stream, 77))
    assert 60 <= first_index <= 77, "the seek should land on a keyframe shortly before the wanted frame"


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_training_clips_are_evenly_stepped_runs_of_real_frames(numbered, suffix):
    ds = VideoClipDataset(
        [numbered[suffix]],
        cfg(min_delta=1, max_delta=3, min_crop_scale=1.0, flip=False, color_jitter=0.0),
        train=True,
    )
    starts, deltas = set(), set()
    for seed in range(16):
        got = frame_numbers(ds[(0, seed)]["video"])
        delta = got[1] - got[0]
        assert got == [got[0] + i * delta for i in range(T)], got
        assert 1 <= delta <= 3 and 0 <= got[0] and got[-1] < 120
        starts.add(got[0])
        deltas.add(delta)
    assert deltas == {1, 2, 3} and len(starts) > 8
    assert any(s >= data.SEEK_MIN_FRAMES for s in starts), "some clips should start late enough to seek"


def test_step_shrinks_to_fit_a_short_video(tmp_path):
    # 20 frames hold 8 frames at step 2 (15 frames) but not at step 3 (22 frames).
    path = write_video(tmp_path / "short.mp4", numbered_frames(20), codec=MP4_BFRAMES)
    ds = VideoClipDataset(
        [path], cfg(min_delta=1, max_delta=5, min_crop_scale=1.0, flip=False, color_jitter=0.0), train=True
    )
    for seed in range(12):
        got = frame_numbers(ds[(0, seed)]["video"])
        delta = got[1] - got[0]
        assert delta in (1, 2) and got == [got[0] + i * delta for i in range(T)] and got[-1] < 20


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_validation_clip_is_frames_from_zero_at_min_delta(numbered, suffix):
    ds = VideoClipDataset([numbered[suffix]], cfg(min_delta=3, max_delta=4), train=False)
    assert frame_numbers(ds[(0, 0)]["video"]) == [3 * i for i in range(T)]


def test_exactly_long_enough_video_without_a_frame_count(tmp_path):
    # Matroska gives no frame count, so the length is estimated from the duration: never a short clip.
    path = write_video(tmp_path / "exact.mkv", numbered_frames(T), codec=MKV_NO_COUNT)
    ds = VideoClipDataset([path], cfg(min_crop_scale=1.0, flip=False, color_jitter=0.0), train=True)
    for seed in range(4):
        assert frame_numbers(ds[(0, seed)]["video"]) == list(range(T))


def write_with_late_last_frame(path: Path, n: int) -> Path:
    """n numbered frames whose last one is stamped 5 frames late: the container's duration then
    claims n + 5 frames, the way a stream with a gap or a wrong header overstates its length."""
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 64, 32, "yuv420p"
        stream.options = {"crf": "0"}
        for i, pixels in enumerate(numbered_frames(n)):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = (i if i < n - 1 else i + 5), Fraction(1, 24)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_overstated_length_never_gives_a_short_clip_and_caching_changes_nothing(tmp_path):
    path = write_with_late_last_frame(tmp_path / "gap.mkv", 12)
    container, stream = data._open_video(path)
    with container:
        assert data._header_frame_count(container, stream) == 17
    settings = cfg(min_delta=1, max_delta=1, min_crop_scale=1.0, flip=False, color_jitter=0.0)
    cold = [frame_numbers(VideoClipDataset([path], settings, True)[(0, s)]["video"]) for s in range(16)]
    for got in cold:
        assert got == list(range(got[0], got[0] + T)) and got[-1] < 12
    assert len({got[0] for got in cold}) > 1
    # An instance that has learnt the true length must pick exactly what a fresh one picks,
    # or two workers would hand out different clips for the same (index, seed).
    warm = VideoClipDataset([path], settings, True)
    for s in range(16):
        warm[(0, s)]
    assert warm._frame_counts == {0: 12}
    assert [frame_numbers(warm[(0, s)]["video"]) for s in range(16)] == cold


# --- bad videos ----------------------------------------------------------------------------------


@pytest.fixture
def with_bad(tmp_path, clips) -> list[Path]:
    """good, corrupt, short, good (in sorted order)."""
    for name in ("a.mp4", "d.mp4"):
        shutil.copy(clips[0], tmp_path / name)
    write_corrupt(tmp_path / "b.mp4")
    make_synthetic(tmp_path / "tmp", clips=1, frames=T - 1, height=48, width=64)
    shutil.move(next((tmp_path / "tmp").iterdir()), tmp_path / "c.mp4")
    paths = find_videos(str(tmp_path))
    assert [p.name for p in paths] == ["a.mp4", "b.mp4", "c.mp4", "d.mp4"]
    return paths


@pytest.mark.parametrize("train", [True, False])
def test_bad_videos_are_skipped_reported_once_and_never_decoded_again(with_bad, train):
    ds = VideoClipDataset(with_bad, cfg(), train=train)
    out = ds[(1, 7)]
    assert out["index"] == 3 and out["video"].shape == (T, 3, H, W)
    assert [s["path"] for s in out["skipped"]] == [str(with_bad[1]), str(with_bad[2])]
    assert "cannot decode" in out["skipped"][0]["reason"]
    assert "too short: 7 frames" in out["skipped"][1]["reason"]
    assert set(ds.bad) == {str(with_bad[1]), str(with_bad[2])}
    # Repair the corrupt file: the dataset must not even look at it again.
    shutil.copy(with_bad[0], with_bad[1])
    again = ds[(1, 7)]
    assert again["index"] == 3 and again["skipped"] == []
    assert torch.equal(again["video"], out["video"])
    assert ds[(2, 7)]["index"] == 3


def test_all_bad_raises_after_max_skip(tmp_path):
    paths = [write_corrupt(tmp_path / f"{i}.mp4") for i in range(5)]
    ds = VideoClipDataset(paths, cfg(max_skip_per_item=3), train=True)
    with pytest.raises(DataSourceError, match="3 videos in a row") as err:
        ds[(1, 0)]
    assert all(str(p) in str(err.value) for p in paths[1:4])
    assert str(paths[0]) not in str(err.value) and str(paths[4]) not in str(err.value)


def test_missing_file_is_skipped(tmp_path, clips):
    ds = VideoClipDataset([tmp_path / "gone.mp4", clips[0]], cfg(), train=True)
    out = ds[(0, 1)]
    assert out["index"] == 1 and "gone.mp4" in out["skipped"][0]["path"]


# --- sampler and loader --------------------------------------------------------------------------


def take(sampler: ResumableSampler, k: int) -> list[tuple[int, int]]:
    it = iter(sampler)
    return [next(it) for _ in range(k)]


@pytest.mark.parametrize("start", [1, 3, 4, 5, 9, 13])
def test_sampler_resume_continues_the_stream(start):
    # 7 items over 2 ranks: 4 per rank per epoch (one padded), so these starts cross epoch boundaries.
    for rank in (0, 1):
        full = take(ResumableSampler(7, rank, 2, seed=11), 20)
        assert take(ResumableSampler(7, rank, 2, seed=11, start=start), 20 - start) == full[start:]


def test_sampler_shards_are_disjoint_within_an_epoch():
    for epoch in range(3):
        shards = [take(ResumableSampler(8, r, 2, seed=3, start=4 * epoch), 4) for r in (0, 1)]
        indices = [{i for i, _ in shard} for shard in shards]
        assert indices[0].isdisjoint(indices[1]) and indices[0] | indices[1] == set(range(8))
    # Padding by wrapping: every item is seen, one twice.
    padded = [i for r in (0, 1) for i, _ in take(ResumableSampler(7, r, 2, seed=3), 4)]
    assert sorted(set(padded)) == list(range(7)) and len(padded) == 8


def test_sampler_epochs_reshuffle_and_seeds_are_unique():
    stream = take(ResumableSampler(16, 0, 1, seed=5), 48)
    epochs = [[i for i, _ in stream[e * 16 : (e + 1) * 16]] for e in range(3)]
    assert all(sorted(e) == list(range(16)) for e in epochs) and epochs[0] != epochs[1]
    rank0, rank1 = take(ResumableSampler(16, 0, 2, seed=5), 24), take(ResumableSampler(16, 1, 2, seed=5), 24)
    seeds = [s for _, s in rank0 + rank1]
    assert len(set(seeds)) == len(seeds)
    # a sample's seed is a function of its global position, so 2 ranks draw what 1 rank draws
    # (a resume at another world size continues the same data)
    dealt = [x for pair in zip(rank0, rank1) for x in pair]
    assert dealt == stream
    assert take(ResumableSampler(16, 0, 1, seed=6), 16) != stream[:16]


def test_sampler_rejects_bad_arguments():
    for args in [(0, 0, 1, 0), (4, 2, 2, 0), (4, 0, 0, 0), (4, 0, 1, 0, -1)]:
        with pytest.raises(ValueError):
            ResumableSampler(*args)


def test_collate_flattens_skips():
    item = lambda i, skips: {
        "video": torch.zeros(T, 3, H, W, dtype=torch.uint8),
        "jitter": torch.full((3,), 1.0 + i),
        "crop": torch.tensor([i, 0, H, W, 0]),
        "index": i,
        "skipped": skips,
    }
    batch = collate_clips(
        [item(0, [{"path": "a", "reason": "r"}]), item(1, []), item(2, [{"path": "b", "reason": "s"}])]
    )
    assert batch["video"].shape == (3, T, 3, H, W) and batch["index"] == [0, 1, 2]
    assert [s["path"] for s in batch["skipped"]] == ["a", "b"]
    assert batch["jitter"][:, 0].tolist() == [1.0, 2.0, 3.0] and batch["crop"][:, 0].tolist() == [0, 1, 2]


@pytest.mark.timeout(120)
def test_loader_with_workers_yields_batches_in_resumed_order(clips):
    ds = VideoClipDataset(clips, cfg(), train=True)
    loader = make_train_loader(
        ds, rank=1, world=2, seed=9, batch_size=2, start_sample=3, num_workers=2, prefetch_factor=1
    )
    assert loader.num_workers == 2 and loader.persistent_workers
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == 2:
            break
    expected = [ResumableSampler(len(clips), 1, 2, seed=9).item_at(p) for p in range(3, 7)]
    assert [i for b in batches for i in b["index"]] == [i for i, _ in expected]
    assert batches[0]["video"].shape == (2, T, 3, H, W) and batches[0]["video"].dtype == torch.uint8
    # A worker process produces the same clip as this process would: augmentation depends only on the item.
    assert torch.equal(batches[0]["video"][0], ds[expected[0]]["video"])


def test_loader_without_workers_sets_no_prefetch(clips):
    loader = make_train_loader(
        VideoClipDataset(clips, cfg(), True), 0, 1, 0, 2, 0, num_workers=0, prefetch_factor=4
    )
    assert loader.prefetch_factor is None and not loader.persistent_workers
    assert next(iter(loader))["video"].shape == (2, T, 3, H, W)


# --- validation items ----------------------------------------------------------------------------


@pytest.mark.parametrize("n_val, world", [(5, 2), (4, 2), (1, 4), (7, 3), (3, 1)])
def test_validation_items_are_even_across_ranks(n_val, world):
    per_rank = [validation_items(n_val, r, world) for r in range(world)]
    assert len({len(items) for items in per_rank}) == 1
    counted = sorted(i for items in per_rank for i, _, counts in items if counts)
    assert counted == list(range(n_val))
    assert all(0 <= i < n_val and seed == 0 for items in per_rank for i, seed, _ in items)


def test_validation_items_empty():
    assert validation_items(0, 0, 2) == [] and validation_items(0, 1, 2) == []


# ---------------------------------------------------------------- several crops per decoded clip


def test_several_crops_per_clip_share_one_decode_and_differ_in_window_and_jitter(clips):
    """data.crops_per_clip = K: one item is one decode cut into K clips, each with its own window,
    flip and jitter. The first crop is the clip a single-crop item would give (same draws), and the
    loader counts K clips per item (the batch holds batch_per_gpu clips, the sampler moves by items)."""
    one = VideoClipDataset(clips, cfg(), train=True)[(2, 77)]
    ds = VideoClipDataset(clips, cfg(crops_per_clip=4), train=True)
    item = ds[(2, 77)]
    assert (
        item["video"].shape == (4, T, 3, H, W)
        and item["jitter"].shape == (4, 3)
        and item["crop"].shape == (4, 5)
    )
    assert torch.equal(item["video"][0], one["video"]) and torch.equal(item["jitter"][0], one["jitter"])
    windows = {tuple(c.tolist()) for c in item["crop"]}
    assert len(windows) == 4, "four different windows"
    assert len({tuple(j.tolist()) for j in item["jitter"]}) == 4, "four different jitters"
    assert torch.equal(ds[(2, 77)]["video"], item["video"])  # reproducible from the item alone
    assert VideoClipDataset(clips, cfg(crops_per_clip=4), train=False)[(2, 0)]["video"].shape == (T, 3, H, W)

    batch = collate_clips([ds[(0, 1)], ds[(1, 2)]])
    assert (
        batch["video"].shape == (8, T, 3, H, W)
        and batch["jitter"].shape == (8, 3)
        and batch["index"] == [0, 1]
    )
    loader = make_train_loader(
        ds, rank=0, world=1, seed=3, batch_size=8, start_sample=5, num_workers=0, prefetch_factor=1
    )
    first = next(iter(loader))
    expected = [ResumableSampler(len(clips), 0, 1, seed=3).item_at(p) for p in (5, 6)]
    assert first["video"].shape == (8, T, 3, H, W) and first["index"] == [i for i, _ in expected]
    with pytest.raises(ValueError, match="whole number of items of 4 crops"):
        make_train_loader(
            ds, rank=0, world=1, seed=3, batch_size=6, start_sample=0, num_workers=0, prefetch_factor=1
        )


def test_crops_per_clip_must_divide_the_batch_and_rules_out_a_latent_cache():
    from trainer.config import TrainConfig

    TrainConfig(data={"crops_per_clip": 4}, optim={"batch_per_gpu": 8})
    with pytest.raises(
        ValueError, match=r"optim.batch_per_gpu \(6\) must be a multiple of data.crops_per_clip \(4\)"
    ):
        TrainConfig(data={"crops_per_clip": 4}, optim={"batch_per_gpu": 6})
    with pytest.raises(ValueError, match="does not work with loss.teacher_cache"):
        TrainConfig(data={"crops_per_clip": 2}, optim={"batch_per_gpu": 2}, loss={"teacher_cache": "/cache"})


def test_read_frames_decodes_with_a_given_hwaccel(tmp_path):
    """benchmarks/decoders.py's NVDEC row decodes through the trainer's own read. The option reaches
    FFmpeg: without a GPU (CI) FFmpeg refuses the CUDA device it was asked for, where a read
    without it succeeds; with one, the frames are the CPU decode's."""
    hwaccel = pytest.importorskip("av.codec.hwaccel")
    path = make_synthetic(tmp_path, 1, 20, 48, 64)[0]
    soft = data.read_frames(path, [3, 4, 5])
    assert soft.shape == (3, 48, 64, 3)
    if not Path("/dev/nvidiactl").exists():
        with pytest.raises((av.FFmpegError, OSError)):
            data.read_frames(path, [3, 4, 5], hwaccel=hwaccel.HWAccel("cuda"))
        return
    hard = data.read_frames(path, [3, 4, 5], hwaccel=hwaccel.HWAccel("cuda"))
    assert hard.shape == soft.shape and np.abs(hard.astype(np.int16) - soft).mean() < 1.0
