package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// The plot: TTFT and ITL as CDFs side by side on top, output tokens/s over
// the load clock below, each endpoint in its own colour.
const (
	plotW, plotH = 1200, 860
)

var (
	colBG     = color.RGBA{255, 255, 255, 255}
	colAxis   = color.RGBA{40, 40, 40, 255}
	colGrid   = color.RGBA{225, 225, 225, 255}
	colText   = color.RGBA{20, 20, 20, 255}
	colSeries = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}}
)

func writePlot(path string, rep *Report) error {
	img := renderPlot(rep)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func renderPlot(rep *Report) *image.RGBA {
	c := &canvas{img: image.NewRGBA(image.Rect(0, 0, plotW, plotH))}
	draw.Draw(c.img, c.img.Bounds(), image.NewUniform(colBG), image.Point{}, draw.Src)

	title := "tokenbus bench: " + rep.Summaries[0].URL
	if len(rep.Summaries) > 1 {
		title = fmt.Sprintf("tokenbus bench: target %s vs baseline %s", rep.Summaries[0].URL, rep.Summaries[1].URL)
	}
	if rep.Interrupted {
		title += " (interrupted, partial)"
	}
	c.text(20, 22, title, colText)
	s0 := rep.Summaries[0]
	c.text(20, 40, fmt.Sprintf("model %s, %s, concurrency %v, request rate %v, %d prompts",
		s0.Model, s0.Endpoint, rep.Config["concurrency"], rep.Config["request_rate"], s0.Sent), colText)

	var ttft, itl [][]float64
	var names []string
	for _, s := range rep.Summaries {
		ttft = append(ttft, s.ttftSamples)
		itl = append(itl, s.itlSamples)
		names = append(names, s.Name)
	}
	cdfPanel(c, image.Rect(80, 80, 570, 420), "TTFT (ms)", names, ttft)
	cdfPanel(c, image.Rect(690, 80, 1180, 420), "inter-token latency (ms)", names, itl)
	timelinePanel(c, image.Rect(80, 530, 1180, 800), rep)
	return c.img
}

// cdfPanel draws the empirical CDF of each (ascending) sample. The x axis ends
// at the largest p99.5 so one outlier does not flatten the curves.
func cdfPanel(c *canvas, r image.Rectangle, xlabel string, names []string, samples [][]float64) {
	xmax := 0.0
	for _, s := range samples {
		if len(s) > 0 {
			xmax = math.Max(xmax, percentile(s, 99.5))
		}
	}
	if xmax <= 0 {
		xmax = 1
	}
	xmax *= 1.05
	p := &panel{c: c, r: r, xmin: 0, xmax: xmax, ymin: 0, ymax: 1}
	p.axes(xlabel, "fraction of samples (CDF)", 5)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		y := p.py(q)
		c.hline(r.Min.X, r.Max.X, int(y), color.RGBA{180, 180, 180, 255}, 4)
		c.text(r.Max.X-28, int(y)-3, fmt.Sprintf("p%g", q*100), colAxis)
	}
	var legend []string
	empty := true
	for i, s := range samples {
		if len(s) == 0 {
			legend = append(legend, names[i]+": no samples")
			continue
		}
		empty = false
		col := colSeries[i%len(colSeries)]
		const steps = 1000
		var px, py float64
		for k := 0; k <= steps; k++ {
			q := float64(k) / steps
			x := percentile(s, q*100)
			X, Y := p.px(math.Min(x, xmax)), p.py(q)
			if k > 0 {
				c.line(px, py, X, Y, col, 2)
			}
			px, py = X, Y
		}
		legend = append(legend, fmt.Sprintf("%s: n=%d p50=%s p99=%s ms", names[i], len(s), num(percentile(s, 50)), num(percentile(s, 99))))
	}
	if empty {
		c.text(r.Min.X+20, r.Min.Y+(r.Dy())/2, "no samples", colAxis)
	}
	p.legend(legend, false)
}

// timelinePanel draws output tokens/s per 1 s of each endpoint's load clock.
func timelinePanel(c *canvas, r image.Rectangle, rep *Report) {
	xmax, ymax := 1.0, 1.0
	for _, s := range rep.Summaries {
		xmax = math.Max(xmax, float64(len(s.Timeline)))
		for _, v := range s.Timeline {
			ymax = math.Max(ymax, v)
		}
	}
	p := &panel{c: c, r: r, xmin: 0, xmax: xmax, ymin: 0, ymax: ymax * 1.1}
	xl := "time under load (s)"
	if len(rep.Summaries) > 1 {
		xl = "time under load (s), each endpoint's rounds placed end to end"
	}
	p.axes(xl, "output tokens/s (1 s buckets)", 6)
	var legend []string
	for i, s := range rep.Summaries {
		col := colSeries[i%len(colSeries)]
		var px, py float64
		for k, v := range s.Timeline {
			X, Y := p.px(float64(k)+0.5), p.py(v)
			if k > 0 {
				c.line(px, py, X, Y, col, 2)
			}
			c.dot(X, Y, col, 3)
			px, py = X, Y
		}
		legend = append(legend, fmt.Sprintf("%s: %.1f tok/s overall", s.Name, s.OutputTokensPerS))
	}
	p.legend(legend, true)
}

// panel maps data coordinates into a pixel rectangle.
type panel struct {
	c                      *canvas
	r                      image.Rectangle
	xmin, xmax, ymin, ymax float64
}

func (p *panel) px(x float64) float64 {
	return float64(p.r.Min.X) + (x-p.xmin)/(p.xmax-p.xmin)*float64(p.r.Dx())
}

func (p *panel) py(y float64) float64 {
	return float64(p.r.Max.Y) - (y-p.ymin)/(p.ymax-p.ymin)*float64(p.r.Dy())
}

// axes draws grid, frame, ticks with labels and the axis labels.
func (p *panel) axes(xlabel, ylabel string, nticks int) {
	c, r := p.c, p.r
	xt := niceTicks(p.xmin, p.xmax, nticks)
	for _, t := range xt {
		x := int(math.Round(p.px(t)))
		c.vline(x, r.Min.Y, r.Max.Y, colGrid, 0)
		c.vline(x, r.Max.Y, r.Max.Y+5, colAxis, 0)
		l := tickLabel(t, xt)
		c.text(x-c.width(l)/2, r.Max.Y+18, l, colText)
	}
	yt := niceTicks(p.ymin, p.ymax, 5)
	for _, t := range yt {
		y := int(math.Round(p.py(t)))
		c.hline(r.Min.X, r.Max.X, y, colGrid, 0)
		c.hline(r.Min.X-5, r.Min.X, y, colAxis, 0)
		l := tickLabel(t, yt)
		c.text(r.Min.X-8-c.width(l), y+4, l, colText)
	}
	c.hline(r.Min.X, r.Max.X, r.Min.Y, colAxis, 0)
	c.hline(r.Min.X, r.Max.X, r.Max.Y, colAxis, 0)
	c.vline(r.Min.X, r.Min.Y, r.Max.Y, colAxis, 0)
	c.vline(r.Max.X, r.Min.Y, r.Max.Y, colAxis, 0)
	c.text(r.Min.X+(r.Dx()-c.width(xlabel))/2, r.Max.Y+40, xlabel, colText)
	c.textUp(r.Min.X-62, r.Min.Y+(r.Dy()+c.width(ylabel))/2, ylabel, colText)
}

// legend draws coloured keys inside the panel's bottom-right corner, or above
// the panel on the right.
func (p *panel) legend(lines []string, above bool) {
	c := p.c
	w := 0
	for _, l := range lines {
		w = max(w, c.width(l))
	}
	boxW, boxH := w+40, 18*len(lines)+8
	x0, y0 := p.r.Max.X-boxW-8, p.r.Max.Y-boxH-8
	if above {
		x0, y0 = p.r.Max.X-boxW, p.r.Min.Y-boxH-4
	}
	draw.Draw(c.img, image.Rect(x0, y0, x0+boxW, y0+boxH), image.NewUniform(colBG), image.Point{}, draw.Src)
	c.hline(x0, x0+boxW, y0, colAxis, 0)
	c.hline(x0, x0+boxW, y0+boxH, colAxis, 0)
	c.vline(x0, y0, y0+boxH, colAxis, 0)
	c.vline(x0+boxW, y0, y0+boxH, colAxis, 0)
	for i, l := range lines {
		y := y0 + 8 + 18*i
		draw.Draw(c.img, image.Rect(x0+8, y+2, x0+28, y+12), image.NewUniform(colSeries[i%len(colSeries)]), image.Point{}, draw.Src)
		c.text(x0+34, y+11, l, colText)
	}
}

// niceTicks returns about n round tick values (1, 2 or 5 × 10^k apart) in [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if !(hi > lo) || n < 1 {
		return []float64{lo}
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, math.Round(t/step)*step)
	}
	return out
}

// tickLabel formats t with as many decimals as the tick spacing needs.
func tickLabel(t float64, ticks []float64) string {
	dec := 0
	if len(ticks) > 1 {
		if step := ticks[1] - ticks[0]; step > 0 && step < 1 {
			dec = int(math.Ceil(-math.Log10(step) - 1e-9))
		}
	}
	return strconv.FormatFloat(t, 'f', dec, 64)
}

// canvas is a minimal raster: lines, dots and basicfont text.
type canvas struct{ img *image.RGBA }

var face = basicfont.Face7x13

func (c *canvas) width(s string) int { return font.MeasureString(face, s).Round() }

func (c *canvas) text(x, y int, s string, col color.Color) {
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: face, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// textUp draws s rotated 90° anticlockwise, starting at (x, y) going up.
func (c *canvas) textUp(x, y int, s string, col color.Color) {
	w := c.width(s)
	tmp := image.NewRGBA(image.Rect(0, 0, w, 16))
	d := font.Drawer{Dst: tmp, Src: image.NewUniform(col), Face: face, Dot: fixed.P(0, 12)}
	d.DrawString(s)
	for i := 0; i < w; i++ {
		for j := 0; j < 16; j++ {
			if px := tmp.RGBAAt(i, j); px.A > 0 {
				c.img.SetRGBA(x+j, y-i, px)
			}
		}
	}
}

func (c *canvas) hline(x0, x1, y int, col color.RGBA, dash int) {
	for x := x0; x <= x1; x++ {
		if dash == 0 || (x/dash)%2 == 0 {
			c.img.SetRGBA(x, y, col)
		}
	}
}

func (c *canvas) vline(x, y0, y1 int, col color.RGBA, dash int) {
	for y := y0; y <= y1; y++ {
		if dash == 0 || (y/dash)%2 == 0 {
			c.img.SetRGBA(x, y, col)
		}
	}
}

func (c *canvas) dot(x, y float64, col color.RGBA, size int) {
	xi, yi := int(math.Round(x)), int(math.Round(y))
	for dx := -size / 2; dx <= size/2; dx++ {
		for dy := -size / 2; dy <= size/2; dy++ {
			c.img.SetRGBA(xi+dx, yi+dy, col)
		}
	}
}

// line draws a segment of the given width by stepping along its longer axis.
func (c *canvas) line(x0, y0, x1, y1 float64, col color.RGBA, width int) {
	n := int(math.Ceil(math.Max(math.Abs(x1-x0), math.Abs(y1-y0))))
	if n == 0 {
		n = 1
	}
	for i := 0; i <= n; i++ {
		t := float64(i) / float64(n)
		c.dot(x0+(x1-x0)*t, y0+(y1-y0)*t, col, width)
	}
}
