/* uPlot charts in the page's dark theme, sized to their container. */
import uPlot from "uplot";

export const AXIS = "#a3acb9";
export const GRID = "#252a32";
const FONT = '11px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';

export interface SeriesSpec {
  label: string;
  colour: string;
  fill?: string;
  dash?: number[];
  stepped?: boolean;
  points?: boolean;
  width?: number;
  value?: (v: number | null) => string;
}

export interface ChartSpec {
  /** an accessible name of the chart */
  label: string;
  series: SeriesSpec[];
  height?: number;
  yRange?: [number, number];
  /** the y axis' tick labels */
  yValues?: (v: number) => string;
  ySplits?: number[];
  /** width of the y axis in CSS pixels (56) */
  ySize?: number;
  /** draws over the plot, under the series (thresholds, bands) */
  under?: (u: uPlot) => void;
}

export interface Chart {
  setData(data: uPlot.AlignedData): void;
  destroy(): void;
}

function axis(values?: (v: number) => string, splits?: number[]): uPlot.Axis {
  const a: uPlot.Axis = {
    stroke: AXIS,
    font: FONT,
    grid: { stroke: GRID, width: 1 },
    ticks: { stroke: GRID, width: 1, size: 4 },
    gap: 4,
  };
  if (values) a.values = (_u, ticks) => ticks.map(values);
  if (splits) a.splits = () => splits;
  return a;
}

/** A chart of data (x = steps) in container, following its width. */
export function makeChart(container: HTMLElement, spec: ChartSpec, data: uPlot.AlignedData): Chart {
  const width = () => Math.max(240, Math.floor(container.clientWidth));
  const opts: uPlot.Options = {
    width: width(),
    height: spec.height ?? 190,
    cursor: { drag: { x: true, y: false }, points: { size: 6 } },
    legend: { live: true },
    scales: { x: { time: false }, y: spec.yRange ? { range: spec.yRange } : { auto: true } },
    axes: [axis((v) => String(v)), Object.assign(axis(spec.yValues, spec.ySplits), { size: spec.ySize ?? 56 })],
    series: [
      { label: "step", value: (_u, v) => (v === null ? "—" : String(v)) },
      ...spec.series.map(
        (s): uPlot.Series => ({
          label: s.label,
          stroke: s.colour,
          width: s.width ?? 1.5,
          fill: s.fill,
          dash: s.dash,
          spanGaps: false,
          points: s.points === undefined ? { size: 5, fill: s.colour } : { show: s.points, size: 5, fill: s.colour },
          paths: s.stepped ? uPlot.paths.stepped!({ align: 1 }) : undefined,
          value: s.value ? (_u, v) => s.value!(v) : undefined,
        }),
      ),
    ],
    hooks: spec.under ? { drawAxes: [spec.under] } : {},
  };
  const plot = new uPlot(opts, data, container);
  plot.root.setAttribute("role", "img");
  plot.root.setAttribute("aria-label", spec.label);
  const resize = new ResizeObserver(() => {
    if (width() !== plot.width) plot.setSize({ width: width(), height: plot.height });
  });
  resize.observe(container);
  return {
    setData: (d) => plot.setData(d),
    destroy: () => {
      resize.disconnect();
      plot.destroy();
    },
  };
}

/** A horizontal line across the plot at y (canvas pixels from valToPos). */
export function hline(u: uPlot, value: number, colour: string, dash: number[] = []): void {
  const y = u.valToPos(value, "y", true);
  const ctx = u.ctx;
  ctx.save();
  ctx.strokeStyle = colour;
  ctx.lineWidth = Math.max(1, devicePixelRatio);
  ctx.setLineDash(dash.map((d) => d * devicePixelRatio));
  ctx.beginPath();
  ctx.moveTo(u.bbox.left, y);
  ctx.lineTo(u.bbox.left + u.bbox.width, y);
  ctx.stroke();
  ctx.restore();
}

/** A filled horizontal band between two y values. */
export function hband(u: uPlot, from: number, to: number, fill: string): void {
  const y0 = u.valToPos(from, "y", true);
  const y1 = u.valToPos(to, "y", true);
  u.ctx.save();
  u.ctx.fillStyle = fill;
  u.ctx.fillRect(u.bbox.left, Math.min(y0, y1), u.bbox.width, Math.abs(y1 - y0));
  u.ctx.restore();
}
