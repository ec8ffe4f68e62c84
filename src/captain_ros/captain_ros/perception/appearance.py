"""Naming what stands on the table by how it looks: for object sets whose names are not a colour and a shape
(LIBERO's groceries, bowls and fixtures), where the built-in segmenter can only say "grey box".

An `AppearanceLibrary` holds one colour histogram per object model (HSV, HIST_BINS bins), averaged over
VIEWS of the model rendered alone (MuJoCo, offscreen, its own meshes and textures). It is built from the
models' asset files, never from a scene: what a detector trained on renders of CAD models knows, and nothing
about where anything is. At run time the regions are the built-in segmenter's depth regions (things standing
on the table, split at depth edges, not by colour: a printed carton is many colours), and a query picks the
regions that look most like the models it names (Bhattacharyya distance between histograms), relative to how
much they look like any other model in the library. Parts of regions are tried too: a thing inside a container or
resting on another is one region with it in depth, and its pixels are those whose colour the named model explains
better than the model the whole region looks like (histogram back-projection). Parts of the regions that look like
a container (CONTAINER_WORDS) are always tried, after the whole regions that match (something put in a basket is
there even when a look-alike stands elsewhere), judged less strictly (CONTAINED_MAX_MARGIN: seen from above, one
side of it), and when no part alone looks like the thing, with the pieces of its print joined (PART_JOIN_PX); parts
of any region when no whole region matches. No simulator state is read.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from captain_ros.perception.cloud import COLOR_NAMES, CameraCloud
from captain_ros.perception.segmenter import object_pixels

HIST_BINS = (12, 4, 4)  # hue, saturation, value
SMOOTHING = (0.25, 0.5)  # a bin keeps half its count and gives a quarter to each neighbour
METHOD = f"hsv{HIST_BINS} smoothed{SMOOTHING}"  # saved with a library: one made otherwise is not comparable
VIEWS = tuple((az, el) for az in range(0, 360, 60) for el in (-20, -45, -70))  # degrees: 18 views around and above
RENDER_PX = 160
MIN_REGION_PX = 40
MAX_DISTANCE = 1.5  # a region further than this from every model the query names is not it
MAX_MARGIN = 0.05  # nor one that looks more than this much more like another model of the library
PART_RATIO = 2.0  # a pixel of a part: its colour at least this much more likely under the named model
PART_JOIN_PX = 7  # pieces of a part this close are one part (a container's, when no piece alone passes)
CONTAINED_MAX_MARGIN = 0.10  # a part of a container is seen from one side (a bottle's cap from above): judged less
# strictly than a whole region (0.05: a looser margin for parts of any region takes slivers of look-alikes)
CONTAINER_WORDS = {"basket", "bowl", "plate", "tray", "caddy", "drainer", "box"}  # models things are put in or on
FIXTURE_SPAN_M = 0.2  # a region this long across stands for a fixture (or things merged with one): its raised parts
RAISED_M = 0.015  # are what stands this far above its top surface, each shorter than FIXTURE_SPAN_M across
STOP_WORDS = {"the", "a", "an", "of", "on", "in", "to", "and", "at", "from", "with"}
COLOR_WORDS = set(COLOR_NAMES) | {"gray"}


def words(text: str) -> set[str]:
    """Lower-case words without digits and stop words, plurals folded ('cookies' -> 'cookie')."""
    out = set()
    for w in re.findall(r"[a-z]+", text.lower()):
        if w in STOP_WORDS:
            continue
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def head_noun(text: str) -> str:
    """The last word that is not a stop word or a number, plural folded ("the bowls on it" -> 'bowl')."""
    found = [w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOP_WORDS and w not in ("it", "them")]
    if not found:
        return ""
    w = found[-1]
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


def histogram(rgb: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Normalised HSV histogram of the masked pixels of an RGB image, each bin shared with its neighbours
    (SMOOTHING; hue wraps around): a scene lit otherwise than the renders shifts colours by a bin or so."""
    hsv = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2HSV)
    h = cv2.calcHist([hsv], [0, 1, 2], mask.astype(np.uint8), list(HIST_BINS), [0, 180, 0, 256, 0, 256])
    h = np.asarray(h, dtype=float).reshape(HIST_BINS)
    side, centre = SMOOTHING
    h = centre * h + side * (np.roll(h, 1, axis=0) + np.roll(h, -1, axis=0))
    for axis in (1, 2):  # saturation and value: the edge bins are repeated beyond the edge
        n = h.shape[axis]
        padded = np.concatenate([np.take(h, [0], axis=axis), h, np.take(h, [n - 1], axis=axis)], axis=axis)
        h = centre * h + side * (np.take(padded, range(n), axis=axis) + np.take(padded, range(2, n + 2), axis=axis))
    h = h.ravel()
    return h / max(float(h.sum()), 1e-12)


def distances(histograms: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Bhattacharyya distance of `h` to each row of `histograms` (0 = the same colours)."""
    return -np.log(np.sqrt(histograms * h[None]).sum(axis=1) + 1e-12)


@dataclass(frozen=True)
class AppearanceLibrary:
    names: tuple[str, ...]  # model names, words separated by '_' ("akita_black_bowl")
    histograms: np.ndarray  # (len(names), prod(HIST_BINS))
    source: str  # where the models came from, for receipts and logs

    def __post_init__(self) -> None:
        if self.histograms.shape != (len(self.names), int(np.prod(HIST_BINS))):
            raise ValueError(f"{len(self.names)} names need {len(self.names)} histograms of {HIST_BINS} bins")

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez_compressed(
            tmp,
            names=np.array(self.names),
            histograms=self.histograms,
            source=np.array(self.source),
            method=np.array(METHOD),
        )
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> AppearanceLibrary:
        """Raises ValueError for a library made with other histograms than this code's (METHOD)."""
        with np.load(path) as f:
            method = str(f["method"]) if "method" in f else "unknown"
            if method != METHOD:
                raise ValueError(f"{path} holds {method} histograms, this code compares {METHOD}: build it again")
            return cls(tuple(str(n) for n in f["names"]), f["histograms"], str(f["source"]))

    def models_for(self, text: str) -> list[int]:
        """The models a query names: those sharing the most of its words (at least half), of them those whose last
        word the query says ("bowl" names the bowls, not the bowl drainer), without a colour word the query does not
        say ("black bowl" is not "red_akita_black_bowl", a recoloured variant)."""
        query = words(text)
        if not query:
            return []
        model_words = [words(n.replace("_", " ")) for n in self.names]
        cover = [len(query & w) / len(query) for w in model_words]
        best = max(cover)
        if best < 0.5:
            return []
        chosen = [i for i, c in enumerate(cover) if c == best]
        # named by what it is: "bowl" is a bowl, not the bowl drainer (whose head noun the query does not say)
        chosen = [i for i in chosen if head_noun(self.names[i].replace("_", " ")) in query] or chosen
        plain = [i for i in chosen if not (model_words[i] & COLOR_WORDS) - query]
        return plain or chosen

    def find(
        self, rgb: np.ndarray, regions: Iterable[np.ndarray], text: str, cloud: CameraCloud | None = None
    ) -> list[tuple[float, np.ndarray, str]]:
        """(score, mask, model name) of the regions that look like what `text` names, best first: ranked by how
        much more they look like another model than like the named ones (0 when a named model is the closest),
        then by distance. Empty when no region is close enough; raises KeyError when no model is named.
        With the cloud, a fixture-sized region's raised parts (raised_parts: a bowl on a cabinet or a stove, one
        region with it in depth and as dark) that look like the named model stand in for the region when they
        look more like it than the whole region does."""
        named = self.models_for(text)
        if not named:
            raise KeyError(text)
        regions = list(regions)
        if cloud is not None:
            regions = [part for mask in regions for part in self._raised_instead(rgb, cloud, mask, named)]
        found = [f for f in (self._judge(rgb, mask, named) for mask in regions) if f is not None]
        found.sort(key=lambda f: (f[0], f[1]))
        in_parts = []
        for mask in regions:
            if self._container(rgb, mask):  # pieces of a print are joined only when no piece alone looks like it
                judged = self._judged_parts(rgb, mask, named, CONTAINED_MAX_MARGIN, join=False)
                in_parts += judged or self._judged_parts(rgb, mask, named, CONTAINED_MAX_MARGIN, join=True)
            elif not found:
                in_parts += self._judged_parts(rgb, mask, named, MAX_MARGIN, join=False)
        in_parts.sort(key=lambda f: (f[0], f[1]))
        return [
            (1.0 / (1.0 + margin + dist), mask, name.replace("_", " ")) for margin, dist, mask, name in found + in_parts
        ]

    def _raised_instead(self, rgb: np.ndarray, cloud: CameraCloud, mask: np.ndarray, named: list[int]):
        """[mask], or the region's raised parts that look like a named model better than the whole region does."""
        parts = [(self._judge(rgb, part, named), part) for part in raised_parts(cloud, mask)]
        parts = [(j, part) for j, part in parts if j is not None]
        if not parts:  # most regions: nothing raised looks like it, and the whole is judged once, in find()
            return [mask]
        whole = self._judge(rgb, mask, named)
        if whole is None or min(j[:2] for j, _ in parts) < whole[:2]:
            return [part for _, part in parts]
        return [mask]

    def _judged_parts(self, rgb: np.ndarray, mask: np.ndarray, named: list[int], max_margin: float, join: bool):
        judged = (self._judge(rgb, part, named, max_margin) for part in self._parts(rgb, mask, named, join))
        return [f for f in judged if f is not None]

    def _container(self, rgb: np.ndarray, mask: np.ndarray) -> bool:
        """Whether a region looks most like a model things are put in or on (CONTAINER_WORDS)."""
        closest = self.names[int(np.argmin(distances(self.histograms, histogram(rgb, mask))))]
        return bool(words(closest.replace("_", " ")) & CONTAINER_WORDS)

    def _judge(self, rgb: np.ndarray, mask: np.ndarray, named: list[int], max_margin: float = MAX_MARGIN):
        """(margin, distance, mask, model) when the masked pixels look like a named model, else None."""
        d = distances(self.histograms, histogram(rgb, mask))
        best_named = min(named, key=lambda i: d[i])
        margin = float(d[best_named] - d.min())
        if d[best_named] <= MAX_DISTANCE and margin <= max_margin:
            return margin, float(d[best_named]), mask, self.names[best_named]
        return None

    def _parts(self, rgb: np.ndarray, mask: np.ndarray, named: list[int], join: bool = False) -> list[np.ndarray]:
        """Connected parts of a region (MIN_REGION_PX or more, opened; with `join` closed across PART_JOIN_PX) whose
        pixels' colours are PART_RATIO times more likely under a named model than under the model the whole region
        looks like most: by hue, saturation and value, or by hue and saturation alone (a scene lit brighter or darker
        than the renders)."""
        d = distances(self.histograms, histogram(rgb, mask))
        host = int(np.argmin(d))
        if host in named:
            return []
        hsv = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2HSV).astype(int)
        nh, ns, nv = HIST_BINS
        hs = (hsv[..., 0] * nh // 180) * ns + hsv[..., 1] * ns // 256
        full = hs * nv + hsv[..., 2] * nv // 256
        chroma = self.histograms.reshape(-1, *HIST_BINS).sum(axis=3).reshape(len(self.names), -1)
        likely = np.zeros(mask.shape, bool)
        for table, bins in ((self.histograms, full), (chroma, hs)):  # brightness told apart, or left to the light
            likely |= table[named].max(axis=0)[bins] > PART_RATIO * table[host][bins]
        part = cv2.morphologyEx((mask & likely).astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
        if join:  # one thing's print split by colours its model does not explain (a carton's stripe): joined
            part = cv2.morphologyEx(part, cv2.MORPH_CLOSE, np.ones((PART_JOIN_PX, PART_JOIN_PX), np.uint8)) & mask
        n, labels, stats, _ = cv2.connectedComponentsWithStats(part, connectivity=8)
        return [labels == i for i in range(1, n) if stats[i, cv2.CC_STAT_AREA] >= MIN_REGION_PX]


def regions(cloud: CameraCloud, min_pixels: int = MIN_REGION_PX) -> list[np.ndarray]:
    """Whole regions of things standing on the table (the built-in segmenter's pixels, split at depth edges only)."""
    mask = cv2.morphologyEx(object_pixels(cloud).astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
    n, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    return [labels == i for i in range(1, n) if stats[i, cv2.CC_STAT_AREA] >= min_pixels]


def raised_parts(cloud: CameraCloud, mask: np.ndarray) -> list[np.ndarray]:
    """What stands on a fixture-sized region's top (FIXTURE_SPAN_M or more across): its pixels more than RAISED_M
    above the top surface, in connected parts of MIN_REGION_PX or more, each less than FIXTURE_SPAN_M across. The
    top surface is the highest height (in 5 mm bins) that holds a tenth of the region's pixels: a flat top seen
    from above gathers many pixels at one height, a side face spreads them over all of its heights."""
    points = cloud.points[mask]
    if len(points) < 2 * MIN_REGION_PX or np.ptp(points[:, :2], axis=0).max() < FIXTURE_SPAN_M:
        return []
    heights = cloud.height_m[mask]
    counts, edges = np.histogram(heights, bins=np.arange(0.0, float(np.nanmax(heights)) + 0.01, 0.005))
    tops = np.flatnonzero(counts >= 0.1 * len(heights))
    if not len(tops):
        return []
    raised = mask & (cloud.height_m > edges[tops[-1] + 1] + RAISED_M)
    raised = cv2.morphologyEx(raised.astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
    n, labels, stats, _ = cv2.connectedComponentsWithStats(raised, connectivity=8)
    parts = [labels == i for i in range(1, n) if stats[i, cv2.CC_STAT_AREA] >= MIN_REGION_PX]
    return [part for part in parts if np.ptp(cloud.points[part][:, :2], axis=0).max() < FIXTURE_SPAN_M]


def renderable(xml: Path) -> str:
    """An asset's MJCF made loadable on its own, for looking at: file paths made absolute (from the compiler's
    meshdir/texturedir), joints removed (a fixture's doors and knobs stand still, so their massless links load),
    a repeated asset name kept once, and LIBERO's own <region> markers dropped."""
    root = ET.parse(xml).getroot()
    folder = xml.parent
    compiler = root.find("compiler")
    dirs = {"mesh": ".", "texture": "."}
    if compiler is not None:
        asset_dir = compiler.attrib.pop("assetdir", ".")
        dirs = {kind: compiler.attrib.pop(f"{kind}dir", asset_dir) for kind in dirs}
    seen: set[tuple[str, str]] = set()
    for parent in root.iter():
        for child in list(parent):
            key = (child.tag, child.get("name", ""))
            if child.tag in ("joint", "freejoint", "region") or (parent.tag == "asset" and key[1] and key in seen):
                parent.remove(child)
                continue
            seen.add(key)
            if parent.tag == "asset" and "file" in child.attrib:
                base = folder / dirs["mesh" if child.tag == "mesh" else "texture"]
                child.set("file", str((base / child.get("file")).resolve()))
    return ET.tostring(root, encoding="unicode")


def render_model(xml: Path, size_px: int = RENDER_PX) -> np.ndarray | None:
    """The histogram of an MJCF model rendered alone from VIEWS (visual geoms only: collision boxes are hidden in
    group 0 by the asset convention); None when nothing of it is visible."""
    import mujoco

    model = mujoco.MjModel.from_xml_string(renderable(xml))
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    visual = np.flatnonzero(model.geom_group != 0)
    visual = visual if len(visual) else np.arange(model.ngeom)
    camera = mujoco.MjvCamera()
    option = mujoco.MjvOption()
    option.geomgroup[:] = 0
    for g in np.unique(model.geom_group[visual]):
        option.geomgroup[int(g)] = 1
    hists = []
    with mujoco.Renderer(model, size_px, size_px) as renderer:
        for azimuth, elevation in VIEWS:
            camera.azimuth, camera.elevation = azimuth, elevation
            camera.distance, camera.lookat[:] = 1.6 * float(model.stat.extent), model.stat.center
            renderer.update_scene(data, camera, option)
            rgb = renderer.render().copy()
            renderer.enable_segmentation_rendering()
            renderer.update_scene(data, camera, option)
            ids = renderer.render()[..., 0]
            renderer.disable_segmentation_rendering()
            mask = np.isin(ids, visual)
            if mask.sum() >= MIN_REGION_PX:
                hists.append(histogram(rgb, mask))
    return np.mean(hists, axis=0) if hists else None


def build_library(models: dict[str, Path], source: str, progress: bool = True) -> AppearanceLibrary:
    """Render every model (name -> MJCF file); a model that does not load or shows nothing is left out, said."""
    from tqdm import tqdm

    names, hists = [], []
    for name, xml in tqdm(sorted(models.items()), desc="appearance models", unit="model", disable=not progress):
        try:
            h = render_model(xml)
        except Exception as exc:  # an asset with a missing file: the library goes on without it
            tqdm.write(f"appearance: {name} left out ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        if h is None:
            tqdm.write(f"appearance: {name} left out (nothing visible)")
            continue
        names.append(name)
        hists.append(h)
    if not names:
        raise ValueError(f"no model of {source} could be rendered")
    return AppearanceLibrary(tuple(names), np.array(hists), source)
