package healthbench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Scrape is the samples of a Prometheus text exposition that the report
// reads: each series without labels by name, and the cumulative buckets
// of histograms by name.
type Scrape struct {
	Values  map[string]float64
	Buckets map[string][]Bucket
}

// Bucket is one cumulative histogram bucket: Count observations at most
// LE.
type Bucket struct {
	LE    float64
	Count float64
}

// ParseScrape reads a Prometheus text exposition. Series with labels are
// skipped, except the le label of histogram buckets.
func ParseScrape(r io.Reader) (*Scrape, error) {
	s := &Scrape{Values: map[string]float64{}, Buckets: map[string][]Bucket{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("sample %q has no value", line)
		}
		series, value := line[:i], line[i+1:]
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("sample %q: %w", line, err)
		}
		name, labels, ok := strings.Cut(series, "{")
		if !ok {
			s.Values[series] = v
			continue
		}
		base, isBucket := strings.CutSuffix(name, "_bucket")
		le, hasLE := strings.CutPrefix(strings.TrimSuffix(labels, "}"), "le=")
		if !isBucket || !hasLE || strings.Contains(le, ",") {
			continue
		}
		bound, err := strconv.ParseFloat(strings.Trim(le, `"`), 64)
		if err != nil {
			return nil, fmt.Errorf("bucket %q: %w", line, err)
		}
		s.Buckets[base] = append(s.Buckets[base], Bucket{LE: bound, Count: v})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, bs := range s.Buckets {
		slices.SortFunc(bs, func(a, b Bucket) int { return cmpFloat(a.LE, b.LE) })
	}
	return s, nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Diff returns the buckets of later minus those of earlier, bucket by
// bucket: the observations between two scrapes. Both must have the same
// bounds.
func Diff(later, earlier []Bucket) ([]Bucket, error) {
	if len(later) != len(earlier) {
		return nil, fmt.Errorf("%d buckets against %d", len(later), len(earlier))
	}
	out := make([]Bucket, len(later))
	for i := range later {
		if later[i].LE != earlier[i].LE {
			return nil, fmt.Errorf("bucket %d: bound %g against %g", i, later[i].LE, earlier[i].LE)
		}
		out[i] = Bucket{LE: later[i].LE, Count: later[i].Count - earlier[i].Count}
	}
	return out, nil
}

// Quantile estimates the q-quantile of cumulative buckets as Prometheus's
// histogram_quantile does: linear within the bucket that holds it, from
// 0 for the first; the last finite bound when it falls in the +Inf
// bucket. It returns NaN without observations.
func Quantile(bs []Bucket, q float64) float64 {
	if len(bs) == 0 {
		return math.NaN()
	}
	total := bs[len(bs)-1].Count
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lo, below := 0.0, 0.0
	for _, b := range bs {
		if b.Count >= rank {
			if math.IsInf(b.LE, 1) {
				return lo
			}
			if b.Count == below {
				return b.LE
			}
			return lo + (b.LE-lo)*(rank-below)/(b.Count-below)
		}
		lo, below = b.LE, b.Count
	}
	return lo
}
