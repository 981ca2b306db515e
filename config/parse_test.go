package config

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vipd/vipd/lb"
)

// exported returns c's exported content: what Parse's callers see.
func exported(c *Config) *Config {
	if c == nil {
		return nil
	}
	return &Config{File: c.File, Include: c.Include, Daemon: c.Daemon, Spec: c.Spec, Health: c.Health}
}

// parseWholeFile is the reference parse of the main file data, reading
// its included files from disk.
func parseWholeFile(file string, data []byte) (*Config, error) {
	return parseWhole(Text{File: file, Data: data}, func(cfg *Config) ([]includedText, error) {
		return readIncluded(cfg.File, cfg.Include)
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// sameParse reports how got differs from want, both results of parsing the
// same input, or "" if they are equal.
func sameParse(got *Config, gotErr error, want *Config, wantErr error) string {
	if g, w := errString(gotErr), errString(wantErr); g != w {
		return fmt.Sprintf("error:\n got %q\nwant %q", g, w)
	}
	if (got == nil) != (want == nil) {
		return fmt.Sprintf("config: got %v, want %v", got != nil, want != nil)
	}
	if !reflect.DeepEqual(exported(got), exported(want)) {
		return fmt.Sprintf("config:\n got %+v\nwant %+v", exported(got), exported(want))
	}
	if got != nil && !bytes.Equal(got.Source(), want.Source()) {
		return "source differs"
	}
	if got != nil && got.Backends() != want.Backends() {
		return fmt.Sprintf("%d backends, want %d", got.Backends(), want.Backends())
	}
	return ""
}

// equivalenceInputs returns configurations that exercise the block
// parser and its fallback to the whole file: the examples, every error
// case, and texts that the block parser must leave to the whole file.
func equivalenceInputs(t *testing.T) map[string][]byte {
	t.Helper()
	in := map[string][]byte{}
	files, err := exampleFiles()
	if err != nil || len(files) == 0 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		in["example "+filepath.Base(f)] = data
	}
	for _, tt := range errorTests {
		in["error "+tt.name] = []byte(tt.in)
	}
	for _, tt := range healthErrorTests {
		in["health error "+tt.name] = []byte(tt.in)
	}
	for n, m := range map[int]int{1: 1, 7: 3, 120: 2} {
		data, _ := benchFixture(t, n, m)
		in[fmt.Sprintf("fixture %dx%d", n, m)] = data
	}
	const svc = "vip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n"
	for name, text := range map[string]string{
		"empty":               "",
		"comments only":       "# nothing\n\n",
		"daemon only":         "[daemon]\ninterface = \"lb0\"\n",
		"blank header":        "[daemon]\n\n  [[ service ]]  # first\n" + svc + "\t[[service]]\t\nname = \"b\"\nvip = \"192.0.2.2\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
		"crlf":                strings.ReplaceAll("[[service]]\n"+svc+"[[service]]\nname = \"b\"\nvip = \"192.0.2.2\"\nport = 81\nbackend = [{ address = \"10.0.0.2\" }]\n", "\n", "\r\n"),
		"no final newline":    "[[service]]\n" + strings.TrimSuffix(svc, "\n"),
		"header at eof":       "[[service]]\n" + svc + "[[service]]",
		"bom":                 "\ufeff[[service]]\n" + svc,
		"bom daemon":          "\ufeff[daemon]\nwatch = false\n[[service]]\n" + svc,
		"quoted header":       "[[\"service\"]]\n" + svc + "[['service']]\nname = \"b\"\nvip = \"192.0.2.2\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
		"daemon after":        "[[service]]\n" + svc + "[daemon]\ninterface = \"lb1\"\n",
		"daemon twice":        "[daemon]\nwatch = true\n[[service]]\n" + svc + "[daemon]\ninterface = \"lb1\"\n",
		"other table after":   "[[service]]\n" + svc + "[other]\nx = 1\n",
		"service table":       "[service]\n" + svc,
		"inline services":     "service = [{ vip = \"192.0.2.1\", port = 80, backend = [{ address = \"10.0.0.1\" }] }]\n",
		"inline then tables":  "service = []\n[[service]]\n" + svc,
		"backend table first": "[[service.backend]]\naddress = \"10.0.0.1\"\n[[service]]\n" + svc,
		"header in string":    "[[service]]\n" + svc + "on_failure = \"remove\"\n[service.check]\ntype = \"http\"\nbody = \"\"\"\n[[service]]\n\"\"\"\n",
		"header in literal":   "[[service]]\n" + svc + "[service.check]\ntype = \"http\"\nbody = '''\n  [[service]] # x\n'''\n",
		"header in array":     "[[service]]\nvip = \"192.0.2.1\"\nport = 80\nbackend = [\n[[service]]\n]\n",
		"uppercase key":       "[[service]]\nName = \"x\"\n" + svc,
		"uppercase table":     "[[Service]]\n" + svc,
		"dotted keys":         "[[service]]\n" + svc + "check.type = \"http\"\ncheck.headers = {}\n",
		"empty arrays":        "[daemon]\nuplinks = []\n[[service]]\nnodeport = true\nport = 30080\ninterfaces = []\nscheduler_flags = []\nbackend = [{ address = \"10.0.0.1\" }]\n",
		"backend tables":      "[[service]]\nvip = \"192.0.2.1\"\nport = 80\n[[service.backend]]\naddress = \"10.0.0.1\"\nweight = 3\n[service.backend.check]\ntype = \"tcp\"\n[[service.backend]]\naddress = \"10.0.0.2\"\n",
		"health": "[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\non_failure = \"remove\"\nquorum = 1\nsorry = \"10.0.0.99:8080\"\n" +
			"[service.check]\ntype = \"http\"\npath = \"/healthz\"\nstatus = \"200-299\"\ninterval = \"1s\"\njitter = 0\nheaders = { Accept = \"x\", \"X-Y\" = \"z\" }\n" +
			"[[service.backend]]\naddress = \"10.0.0.1\"\n[[service.backend]]\naddress = \"10.0.0.2\"\ncheck = { type = \"tcp\", port = 8081, initial = \"up\", jitter = 0.25 }\n" +
			"[[service.backend]]\naddress = \"10.0.0.3\"\ncheck = { type = \"none\" }\n",
		"policy only":      "[[service]]\n" + svc + "on_failure = \"quiesce\"\n",
		"exec check":       "[daemon]\ncheck_user = \"nobody\"\n[[service]]\n" + svc + "check = { type = \"exec\", command = \"/bin/true\", args = [], env = [\"A=1\"] }\n",
		"wrong type":       "[[service]]\nvip = \"192.0.2.1\"\nport = \"80\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
		"float port":       "[[service]]\nvip = \"192.0.2.1\"\nport = 80.0\nbackend = [{ address = \"10.0.0.1\" }]\n",
		"duration int":     "[[service]]\n" + svc + "persistence = 60\n",
		"duration date":    "[[service]]\n" + svc + "persistence = 1979-05-27\n",
		"nodeport clash":   "[[service]]\nname = \"a\"\nnodeport = true\nport = 30000\nbackend = [{ address = \"10.0.0.1\" }]\n[[service]]\nname = \"b\"\nnodeport = true\nport = 30000\nprotocol = \"udp\"\nbackend = [{ address = \"10.0.0.2\" }]\n",
		"fwmark and vip":   "[[service]]\nname = \"f\"\nfwmark = 1\nbackend = [{ address = \"10.0.0.1\" }]\n[[service]]\nname = \"g\"\nfwmark = 1\nfamily = \"ipv6\"\nbackend = [{ address = \"fd00::1\" }]\n",
		"announce shared":  "[[service]]\n" + svc + "announce = false\n[[service]]\nname = \"b\"\nvip = \"192.0.2.1\"\nport = 81\nannounce = false\nbackend = [{ address = \"10.0.0.1\" }]\n",
		"snat no iptables": "[daemon]\nmanage_iptables = false\n[[service]]\n" + svc + "snat = false\n",
		// Invalid TOML that BurntSushi accepts (but the second) and
		// go-toml rejects: the block parser decodes these blocks with
		// BurntSushi.
		"dotted then table":    "[[service]]\n" + svc + "check.type = \"tcp\"\n[service.check]\nport = 81\n",
		"inline then table":    "[[service]]\n" + svc + "check = { type = \"tcp\" }\n[service.check]\nport = 81\n",
		"inline then dotted":   "[[service]]\n" + svc + "check = {}\ncheck.type = \"tcp\"\n",
		"dotted then value":    "[[service]]\n" + svc + "check.type = \"tcp\"\ncheck = { type = \"http\" }\n",
		"daemon dotted":        "daemon.interface = \"lb2\"\n[daemon]\nwatch = false\n[[service]]\n" + svc,
		"reload guard int":     "[daemon]\nreload_guard = 1\n[[service]]\n" + svc,
		"reload guard float":   "[daemon]\nreload_guard = 0.25\nresync_interval = 60\ngarp_refresh = \"10s\"\n[[service]]\n" + svc,
		"duration float":       "[[service]]\n" + svc + "persistence = 60.0\n",
		"uppercase daemon key": "[daemon]\nInterface = \"lb3\"\n[[service]]\n" + svc,
	} {
		in[name] = []byte(text)
	}
	return in
}

// TestParseEquivalence checks that the block parser returns exactly what
// the whole-file parser does, configurations and errors.
func TestParseEquivalence(t *testing.T) {
	for name, data := range equivalenceInputs(t) {
		t.Run(name, func(t *testing.T) {
			want, wantErr := parseWholeFile("t.toml", data)
			got, d, err := ParseFrom(nil, "t.toml", data)
			if diff := sameParse(got, err, want, wantErr); diff != "" {
				t.Fatal(diff)
			}
			if err == nil {
				checkDelta(t, nil, got, d)
			}
		})
	}
}

// TestParseBlockPath checks that valid files of the usual shapes take the
// block path (so that a reload can be incremental), and what falls back.
func TestParseBlockPath(t *testing.T) {
	in := equivalenceInputs(t)
	for _, name := range []string{"example demo.toml", "example reference.toml", "example health.toml", "fixture 120x2",
		"blank header", "crlf", "no final newline", "health", "policy only", "exec check", "dotted keys", "empty arrays",
		"backend tables", "uppercase key", "empty", "daemon only", "announce shared", "snat no iptables",
		"dotted then table", "inline then dotted", "daemon dotted", "reload guard int", "reload guard float",
		"uppercase daemon key"} {
		if !blockParsed(in[name]) {
			t.Errorf("%s: not parsed block by block", name)
		}
	}
	for _, name := range []string{"bom", "quoted header", "daemon after", "header in string", "header in literal", "uppercase table"} {
		if blockParsed(in[name]) {
			t.Errorf("%s: parsed block by block", name)
		}
		if _, err := Parse("t.toml", in[name]); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// blockParsed reports whether data parses block by block.
func blockParsed(data []byte) bool {
	cfg, err := Parse("t.toml", data)
	return err == nil && cfg.parts[0].chunks != nil
}

// checkDelta checks d's promises about cfg and base.
func checkDelta(t *testing.T, base, cfg *Config, d Delta) {
	t.Helper()
	var old []lb.VirtualService
	if base != nil {
		old = base.Spec.Services
	}
	cur := cfg.Spec.Services
	if d.Full {
		if d.From != 0 || d.OldTo != len(old) || d.NewTo != len(cur) {
			t.Fatalf("full delta %+v for %d -> %d services", d, len(old), len(cur))
		}
		return
	}
	if base == nil {
		t.Fatalf("delta %+v without a base", d)
	}
	if d.From < 0 || d.From > d.OldTo || d.OldTo > len(old) || d.From > d.NewTo || d.NewTo > len(cur) || len(cur)-d.NewTo != len(old)-d.OldTo {
		t.Fatalf("delta %+v for %d -> %d services", d, len(old), len(cur))
	}
	same := func(a, b []lb.VirtualService) bool {
		return slices.EqualFunc(a, b, func(x, y lb.VirtualService) bool { return reflect.DeepEqual(x, y) })
	}
	if !same(cur[:d.From], old[:d.From]) || !same(cur[d.NewTo:], old[d.OldTo:]) {
		t.Fatalf("delta %+v: services outside the range differ", d)
	}
	if !reflect.DeepEqual(cfg.Daemon, base.Daemon) || cfg.Spec.StrictARP != base.Spec.StrictARP ||
		cfg.Spec.ManageSysctls != base.Spec.ManageSysctls || cfg.Spec.Rules != base.Spec.Rules {
		t.Fatalf("delta %+v: daemon settings differ", d)
	}
	for _, vs := range slices.Concat(cur[:d.From], cur[d.NewTo:]) {
		h1, ok1 := cfg.Health[vs.Name]
		h2, ok2 := base.Health[vs.Name]
		if ok1 != ok2 || !reflect.DeepEqual(h1, h2) {
			t.Fatalf("delta %+v: health of unchanged service %q differs", d, vs.Name)
		}
	}
}

// scenarioService is one service of a generated configuration.
type scenarioService struct {
	id        int // stable across edits: it numbers the backends
	name, vip string
	port      int
	weights   []int
	check     bool // a health check
	announce  string
}

type scenario struct {
	daemon   string
	services []scenarioService
}

func (s scenario) text() []byte {
	var b strings.Builder
	b.WriteString("# scenario\n")
	b.WriteString(s.daemon)
	for _, vs := range s.services {
		fmt.Fprintf(&b, "\n# service %d\n[[service]]\nname = %q\nvip = %q\nport = %d\n", vs.id, vs.name, vs.vip, vs.port)
		if vs.announce != "" {
			fmt.Fprintf(&b, "announce = %s\n", vs.announce)
		}
		if vs.check {
			b.WriteString("on_failure = \"remove\"\ncheck = { type = \"tcp\", interval = \"2s\" }\n")
		}
		b.WriteString("backend = [")
		for j, w := range vs.weights {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "{ address = \"10.%d.%d.%d\", weight = %d }", vs.id/200, vs.id%200, j+1, w)
		}
		b.WriteString("]\n")
	}
	return []byte(b.String())
}

func (s scenario) clone() scenario {
	c := scenario{daemon: s.daemon, services: slices.Clone(s.services)}
	for i := range c.services {
		c.services[i].weights = slices.Clone(c.services[i].weights)
	}
	return c
}

func newScenario(n int) scenario {
	s := scenario{daemon: "[daemon]\ninterface = \"lb0\"\nwatch = true\n"}
	for i := range n {
		s.services = append(s.services, scenarioService{
			id: i, name: fmt.Sprintf("svc%d", i), vip: fmt.Sprintf("192.0.2.%d", i/4+1), port: 80 + i%4,
			weights: []int{1, 2, 3}, check: i%3 == 0,
		})
	}
	return s
}

// reparse parses data from prev, compares with the whole-file parser
// (Parse's reference behaviour), checks the delta and
// that prev is unchanged, and returns the new configuration (or prev on
// error).
func reparse(t *testing.T, prev *Config, data []byte) (*Config, Delta, error) {
	t.Helper()
	var before *Config
	if prev != nil {
		before = exported(prev)
		before.Spec.Services = slices.Clone(before.Spec.Services)
	}
	if prev != nil {
		checkSplit(t, data, &prev.parts[0])
	}
	got, d, err := ParseFrom(prev, "s.toml", data)
	want, wantErr := parseWholeFile("s.toml", data)
	if diff := sameParse(got, err, want, wantErr); diff != "" {
		t.Fatal(diff)
	}
	if prev != nil {
		again, _ := Parse("s.toml", prev.Source())
		if !reflect.DeepEqual(exported(prev), before) || !reflect.DeepEqual(exported(prev), exported(again)) {
			t.Fatal("the base changed")
		}
	}
	if err != nil {
		return prev, d, err
	}
	checkDelta(t, prev, got, d)
	return got, d, nil
}

// TestParseFromScenario edits a configuration step by step and checks
// every step against a parse from scratch.
func TestParseFromScenario(t *testing.T) {
	s := newScenario(40)
	cfg, _, err := reparse(t, nil, s.text())
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		name string
		edit func(s *scenario)
		// span is the largest number of services the delta may replace,
		// or -1 for a full delta; errs wants a failure.
		span int
		errs bool
	}
	steps := []step{
		{"weight", func(s *scenario) { s.services[20].weights[1] = 7 }, 1, false},
		{"weight width", func(s *scenario) { s.services[20].weights[1] = 12345 }, 1, false},
		{"add backend", func(s *scenario) { s.services[21].weights = append(s.services[21].weights, 4) }, 1, false},
		{"remove backend", func(s *scenario) { s.services[21].weights = s.services[21].weights[:1] }, 1, false},
		{"unchanged", func(s *scenario) {}, 0, false},
		{"first service", func(s *scenario) { s.services[0].weights[0] = 9 }, 1, false},
		{"last service", func(s *scenario) { s.services[len(s.services)-1].weights[2] = 9 }, 1, false},
		{"add health", func(s *scenario) { s.services[1].check = true }, 1, false},
		{"remove health", func(s *scenario) { s.services[0].check = false }, 1, false},
		{"add service", func(s *scenario) {
			s.services = slices.Insert(s.services, 10, scenarioService{id: 1000, name: "new", vip: "198.51.100.1", port: 443, weights: []int{5}})
		}, 2, false},
		{"remove service", func(s *scenario) { s.services = slices.Delete(s.services, 30, 31) }, 2, false},
		{"remove first", func(s *scenario) { s.services = s.services[1:] }, 2, false},
		{"append service", func(s *scenario) {
			s.services = append(s.services, scenarioService{id: 1001, name: "tail", vip: "198.51.100.2", port: 80, weights: []int{1}, check: true})
		}, 2, false},
		{"remove last", func(s *scenario) { s.services = s.services[:len(s.services)-1] }, 2, false},
		{"reorder", func(s *scenario) { s.services[5], s.services[6] = s.services[6], s.services[5] }, 3, false}, // and the comment above them
		{"rename", func(s *scenario) { s.services[7].name = "renamed" }, 1, false},
		{"daemon", func(s *scenario) { s.daemon = "[daemon]\ninterface = \"lb1\"\nwatch = true\n" }, -1, false},
		{"daemon comment", func(s *scenario) { s.daemon += "# the same settings\n" }, 0, false},
		{"daemon and service", func(s *scenario) {
			s.daemon = "[daemon]\ninterface = \"lb2\"\nwatch = true\n"
			s.services[3].weights[0] = 3
		}, -1, false},
		{"iptables", func(s *scenario) { s.daemon += "manage_iptables = false\n" }, -1, false},
		{"insert first", func(s *scenario) {
			s.services = slices.Insert(s.services, 0, scenarioService{id: 1002, name: "front", vip: "198.51.100.3", port: 80, weights: []int{2}})
		}, 1, false},
		{"daemon invalid", func(s *scenario) { s.daemon += "garp_count = 1000\n" }, 0, true},
		{"duplicate name", func(s *scenario) { s.services[12].name = s.services[3].name }, 0, true},
		{"valid again", func(s *scenario) { s.services[12].weights[0] = 4 }, 1, false},
		{"duplicate key", func(s *scenario) { s.services[13].vip, s.services[13].port = s.services[2].vip, s.services[2].port }, 0, true},
		{"announce conflict", func(s *scenario) { s.services[14].announce = "false" }, 0, true},
		{"valid after conflicts", func(s *scenario) { s.services[15].weights[0] = 8 }, 1, false},
		{"invalid weight", func(s *scenario) { s.services[16].weights[0] = -1 }, 0, true},
		{"swap names", func(s *scenario) { s.services[3].name, s.services[4].name = s.services[4].name, s.services[3].name }, 2, false},
		{"shared vip announce", func(s *scenario) {
			// Every service on one VIP changes announce in one edit (they
			// are in a row).
			for i := range s.services {
				if s.services[i].vip == "192.0.2.4" {
					s.services[i].announce = "false"
				}
			}
		}, 4, false},
		{"everything", func(s *scenario) {
			for i := range s.services {
				s.services[i].weights[0]++
			}
		}, 1 << 20, false},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			next := s.clone()
			st.edit(&next)
			got, d, err := reparse(t, cfg, next.text())
			if st.errs {
				if err == nil {
					t.Fatal("no error")
				}
				return // the daemon keeps cfg
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case st.span < 0 && !d.Full:
				t.Errorf("delta %+v, want a full one", d)
			case st.span >= 0 && (d.Full || d.OldTo-d.From > st.span || d.NewTo-d.From > st.span):
				t.Errorf("delta %+v, want at most %d services replaced", d, st.span)
			}
			s, cfg = next, got
		})
	}
}

// TestParseFromOlderBase parses B from A, then C from A again (a rejected
// reload keeps A): each parse checks against its own base's services,
// whatever was parsed from that base since.
func TestParseFromOlderBase(t *testing.T) {
	s := newScenario(12)
	a, _, err := reparse(t, nil, s.text())
	if err != nil {
		t.Fatal(err)
	}
	sb := s.clone()
	sb.services[5].name = "b-name" // frees "svc5"
	b, _, err := reparse(t, a, sb.text())
	if err != nil {
		t.Fatal(err)
	}
	// From A, "svc5" is taken: a check against B's services would miss it.
	sc := s.clone()
	sc.services[8].name = "svc5"
	if _, _, err := reparse(t, a, sc.text()); err == nil || !strings.Contains(err.Error(), "name already used") {
		t.Fatalf("err = %v, want a duplicate name", err)
	}
	sc = s.clone()
	sc.services[8].name = "b-name"
	c, d, err := reparse(t, a, sc.text())
	if err != nil {
		t.Fatal(err)
	}
	if d.Full || d.From != 8 || d.OldTo != 9 || d.NewTo != 9 {
		t.Fatalf("delta = %+v", d)
	}
	// From B, "b-name" is taken.
	sd := sb.clone()
	sd.services[9].name = "b-name"
	if _, _, err := reparse(t, b, sd.text()); err == nil || !strings.Contains(err.Error(), "name already used") {
		t.Fatalf("err = %v, want a duplicate name", err)
	}
	sd = sb.clone()
	sd.services[9].weights[0] = 5
	if _, _, err := reparse(t, b, sd.text()); err != nil {
		t.Fatal(err)
	}
	// And C goes on from its own.
	se := sc.clone()
	se.services[2].weights[0] = 6
	if _, _, err := reparse(t, c, se.text()); err != nil {
		t.Fatal(err)
	}
}

// TestParseFromFallbackBase parses from a base that the block parser
// could not read (it came from the whole-file path).
func TestParseFromFallbackBase(t *testing.T) {
	const svc = "vip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n"
	base, _, err := reparse(t, nil, []byte("[[\"service\"]]\n"+svc))
	if err != nil {
		t.Fatal(err)
	}
	cfg, d, err := reparse(t, base, []byte("[[service]]\n"+svc))
	if err != nil {
		t.Fatal(err)
	}
	// The main file is read again whole; the settings are the same, so
	// only its services count as changed.
	if d.Full || d.From != 0 || d.OldTo != 1 || d.NewTo != 1 {
		t.Fatalf("delta = %+v", d)
	}
	if _, d, err := reparse(t, cfg, []byte("[[service]]\n"+strings.Replace(svc, "10.0.0.1", "10.0.0.2", 1))); err != nil || d.Full {
		t.Fatalf("delta = %+v, %v", d, err)
	}
}

// TestParseFromFileName refuses a file that is neither the main file nor
// matched by an include pattern.
func TestParseFromFileName(t *testing.T) {
	data := newScenario(3).text()
	a, err := Parse("a.toml", data)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := ParseFrom(a, "b.toml", data)
	if b != nil || err == nil || err.Error() != "b.toml: not part of the configuration: no include pattern of a.toml matches it" {
		t.Fatalf("got %v, %v", b, err)
	}
}

// checkEdit parses edited from a (if a is valid; nil means no base) with
// checkParse.
func checkEdit(t *testing.T, a, edited []byte) {
	var base *Config
	if a != nil {
		if c, err := Parse("f.toml", a); err == nil {
			base = c
		}
	}
	if base != nil {
		checkSplit(t, edited, &base.parts[0])
	}
	checkParse(t, base, edited, nil, nil)
}

// checkSplit checks splitBlocks' result for data against a scan of the
// whole text, and that the blocks it keeps have the text of old's.
func checkSplit(t *testing.T, data []byte, old *part) {
	t.Helper()
	chunks, keep, keepEnd := splitBlocks(data, old)
	if want := blockStarts(data); !slices.Equal(chunks, want) {
		t.Fatalf("splitBlocks(%q) = %v, want %v", data, chunks, want)
	}
	if old.chunks == nil {
		return
	}
	n, on := len(chunks)-1, len(old.chunks)-1
	if keep+keepEnd > min(n, on) {
		t.Fatalf("splitBlocks(%q) keeps %d+%d of %d and %d blocks", data, keep, keepEnd, n, on)
	}
	text := func(d []byte, c []int, i int) []byte {
		end := len(d)
		if i+2 < len(c) {
			end = c[i+2]
		}
		return d[c[i+1]:end]
	}
	for i := range keep {
		if !bytes.Equal(text(data, chunks, i), text(old.src, old.chunks, i)) {
			t.Fatalf("splitBlocks(%q) keeps block %d, which changed", data, i)
		}
	}
	for i := range keepEnd {
		if !bytes.Equal(text(data, chunks, n-1-i), text(old.src, old.chunks, on-1-i)) {
			t.Fatalf("splitBlocks(%q) keeps block %d from the end, which changed", data, i)
		}
	}
}

// checkParse parses data from base (which may be nil) and checks the
// result against the whole-file parser, tolerating only the decoder's own
// nondeterminism (it maps keys that differ in case to one field in random
// order). If got or gotErr is set, it is the result to check instead.
func checkParse(t *testing.T, base *Config, data []byte, got *Config, err error) {
	t.Helper()
	var before *Config
	if base != nil {
		before = exported(base)
		before.Spec.Services = slices.Clone(before.Spec.Services)
	}
	var d Delta
	switch {
	case got == nil && err == nil:
		got, d, err = ParseFrom(base, "f.toml", data)
	case got != nil:
		d = fullDelta(base, got)
	}
	want, wantErr := parseWholeFile("f.toml", data)
	if diff := sameParse(got, err, want, wantErr); diff != "" {
		// The decoder's map order may pick one of two spellings only one
		// time in eight: try often.
		for range 200 {
			again, againErr := parseWholeFile("f.toml", data)
			if sameParse(again, againErr, want, wantErr) != "" {
				return // Parse itself is not deterministic on this input
			}
		}
		t.Fatalf("ParseFrom(%q): %s", data, diff)
	}
	if base != nil && !reflect.DeepEqual(exported(base), before) {
		t.Fatal("the base changed")
	}
	if err == nil {
		checkDelta(t, base, got, d)
	}
}

// FuzzIncremental edits a configuration (deletes del bytes at off and
// inserts ins) and checks that ParseFrom from the original returns what
// Parse returns for the edit.
func FuzzIncremental(f *testing.F) {
	files, _ := exampleFiles()
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, uint(len(data)/2), uint(3), []byte("1"))
		f.Add(data, uint(len(data)/3), uint(0), []byte("\n[[service]]\nvip = \"192.0.2.99\"\nport = 1\nbackend = [{ address = \"10.9.9.9\" }]\n"))
	}
	s := newScenario(6).text()
	f.Add(s, uint(len(s)/2), uint(1), []byte("\"\"\"\n"))
	f.Add(s, uint(len(s)/2), uint(40), []byte(""))
	f.Fuzz(func(t *testing.T, data []byte, off, del uint, ins []byte) {
		o := int(off % uint(len(data)+1))
		e := o + int(del%uint(len(data)-o+1))
		edited := slices.Concat(data[:o], ins, data[e:])
		checkEdit(t, data, edited)
	})
}

// TestParseFromLarge edits a file large enough for the parallel decoding
// of blocks.
func TestParseFromLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large file")
	}
	data, f := benchFixture(t, 2500, 10)
	prev, err := Parse("bench.toml", data)
	if err != nil {
		t.Fatal(err)
	}
	g := f.WithWeight(1250, 3, 7)
	g = g.WithWeight(1251, 0, 100)
	g.Services[0].Backends = g.Services[0].Backends[:4]
	g.Services[2499].Backends = append(slices.Clone(g.Services[2499].Backends), g.Services[2499].Backends[0])
	g.Services[2499].Backends[10].Addr = netip.MustParseAddrPort("192.0.2.200:8080")
	for _, step := range []struct {
		data     []byte
		from, to int
	}{
		{fixtureTOML(t, f.WithWeight(1250, 3, 7)), 1250, 1251},
		{fixtureTOML(t, g), 0, 2500},
		{data, 0, 2500},
	} {
		cfg, d, err := ParseFrom(prev, "bench.toml", step.data)
		if err != nil {
			t.Fatal(err)
		}
		want, err := Parse("bench.toml", step.data)
		if err != nil {
			t.Fatal(err)
		}
		if diff := sameParse(cfg, nil, want, nil); diff != "" {
			t.Fatal(diff)
		}
		checkDelta(t, prev, cfg, d)
		if d.Full || d.From != step.from || d.OldTo != step.to || d.NewTo != step.to {
			t.Fatalf("delta = %+v, want %d..%d", d, step.from, step.to)
		}
		prev = cfg
	}
}

// TestParseFromRandomEdits chains random edits, valid and not, each parsed
// from the last valid configuration and checked against the whole-file
// parser.
func TestParseFromRandomEdits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newScenario(30)
	cfg, _, err := reparse(t, nil, s.text())
	if err != nil {
		t.Fatal(err)
	}
	id, valid, incremental := 2000, 0, 0
	for step := range 400 {
		next := s.clone()
		for range 1 + rng.IntN(3) {
			n := len(next.services)
			i := rng.IntN(n)
			vs := &next.services[i]
			switch rng.IntN(11) {
			case 0:
				vs.weights[rng.IntN(len(vs.weights))] = rng.IntN(200)
			case 1:
				vs.weights = append(vs.weights, 1)
			case 2:
				if len(vs.weights) > 1 {
					vs.weights = vs.weights[:len(vs.weights)-1]
				}
			case 3:
				id++
				next.services = slices.Insert(next.services, rng.IntN(n+1), scenarioService{
					id: id, name: fmt.Sprintf("r%d", id), vip: fmt.Sprintf("198.18.%d.%d", id/250, id%250+1), port: 80, weights: []int{1}})
			case 4:
				if n > 1 {
					next.services = slices.Delete(next.services, i, i+1)
				}
			case 5:
				vs.check = !vs.check
			case 6:
				vs.name = next.services[rng.IntN(n)].name // often a duplicate
			case 7:
				vs.announce = []string{"", "true", "false"}[rng.IntN(3)]
			case 8:
				j := rng.IntN(n)
				next.services[i], next.services[j] = next.services[j], next.services[i]
			case 9:
				next.daemon = fmt.Sprintf("[daemon]\ninterface = \"lb%d\"\n", rng.IntN(3))
			case 10:
				vs.port = 80 + rng.IntN(4) // maybe another service's key
			}
		}
		text := next.text()
		if rng.IntN(8) == 0 {
			// A raw edit: delete a range, or copy one elsewhere.
			a, b := rng.IntN(len(text)), rng.IntN(len(text))
			if a > b {
				a, b = b, a
			}
			b = min(b, a+200)
			if rng.IntN(2) == 0 {
				text = slices.Concat(text[:a], text[b:])
			} else {
				at := rng.IntN(len(text))
				text = slices.Concat(text[:at], text[a:b], text[at:])
			}
		}
		got, d, err := reparse(t, cfg, text)
		if err == nil {
			s, cfg = next, got
			valid++
			if !d.Full {
				incremental++
			}
		} else if step%50 == 0 {
			t.Logf("step %d: %v", step, strings.SplitN(err.Error(), "\n", 2)[0])
		}
	}
	t.Logf("%d valid steps, %d incremental", valid, incremental)
	if incremental < 100 {
		t.Errorf("only %d incremental steps", incremental)
	}
}

// TestParseFromConcurrent parses edits of one base from many goroutines
// at once, the main file's and an included file's, as a daemon that checks
// a file while it reloads another would: run with -race. Each result is
// the whole parse's, and the base stays as it was.
func TestParseFromConcurrent(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	incl := filepath.Join(dir, "more.toml")
	s := newScenario(40)
	more := newScenario(0)
	for i := range 20 {
		id := 500 + i
		more.services = append(more.services, scenarioService{id: id, name: fmt.Sprintf("m%d", id), vip: "198.51.100.7", port: id, weights: []int{1, 2}})
	}
	moreText := func(sc scenario) []byte {
		_, after, _ := bytes.Cut(sc.text(), []byte("[[service]]"))
		return append([]byte("[[service]]"), after...)
	}
	mainText := func(sc scenario) []byte { return append([]byte("include = [\"more.toml\"]\n"), sc.text()...) }
	if err := os.WriteFile(main, mainText(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(incl, moreText(more), 0o644); err != nil {
		t.Fatal(err)
	}
	base, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	before := exported(base)
	before.Spec.Services = slices.Clone(before.Spec.Services)
	beforeTexts := base.Texts()

	type job struct {
		file string
		data []byte
		bad  bool
	}
	var jobs []job
	for i := range 16 {
		m, o := s.clone(), more.clone()
		switch i % 4 {
		case 0:
			m.services[i].weights[0] = 100 + i
		case 1:
			o.services[i].weights[1] = 100 + i
		case 2:
			m.services[i].name = m.services[i+1].name
		case 3:
			o.services[i].name = m.services[0].name // a conflict across files
		}
		if i%2 == 0 {
			jobs = append(jobs, job{main, mainText(m), i%4 == 2})
		} else {
			jobs = append(jobs, job{incl, moreText(o), i%4 == 3})
		}
	}
	type result struct {
		cfg *Config
		d   Delta
		err error
	}
	results := make([]result, len(jobs))
	var wg sync.WaitGroup
	for round := range 4 {
		wg.Go(func() {
			// The included file removed, alongside.
			cfg, d, err := ParseRemoved(base, incl)
			if err != nil || len(cfg.Spec.Services) != 40 || d.Full || d.From != 40 || d.OldTo != 60 || d.NewTo != 40 {
				t.Errorf("round %d: removing %s: %v, delta %+v", round, incl, err, d)
			}
		})
		for i, j := range jobs {
			wg.Go(func() {
				cfg, d, err := ParseFrom(base, j.file, j.data)
				if round == 0 {
					results[i] = result{cfg, d, err}
				}
				if err == nil {
					_ = cfg.Backends()
					_ = cfg.Files()
				}
			})
		}
	}
	wg.Wait()
	for i, j := range jobs {
		r := results[i]
		if j.bad != (r.err != nil) {
			t.Fatalf("job %d: err %v, want one: %v", i, r.err, j.bad)
		}
		// The reference: the whole parse of base's files with this one's
		// text.
		mainData, inclData := beforeTexts[0].Data, beforeTexts[1].Data
		if j.file == main {
			mainData = j.data
		} else {
			inclData = j.data
		}
		want, wantErr := parseWhole(Text{File: main, Data: mainData}, func(cfg *Config) ([]includedText, error) {
			return []includedText{{Text{File: incl, Data: inclData}, 0}}, nil
		})
		if diff := sameParse(r.cfg, r.err, want, wantErr); diff != "" {
			t.Fatalf("job %d: %s", i, diff)
		}
		if r.err == nil {
			checkDelta(t, base, r.cfg, r.d)
			if r.d.Full {
				t.Errorf("job %d: full delta", i)
			}
		}
	}
	if !reflect.DeepEqual(exported(base), before) || !reflect.DeepEqual(base.Texts(), beforeTexts) {
		t.Fatal("the base changed")
	}
}

// TestParseFromConflicts edits one file of two so that a service of the
// edit conflicts with one of the other file, which the edit keeps, in
// every way services can conflict: each edit fails as the whole parse
// does, and the edits without conflict succeed with a partial delta.
func TestParseFromConflicts(t *testing.T) {
	dir := t.TempDir()
	main, more := filepath.Join(dir, "vipd.toml"), filepath.Join(dir, "more.toml")
	svc := func(name, vip string, port int, extra, backend string) string {
		return fmt.Sprintf("[[service]]\nname = %q\nvip = %q\nport = %d\n%sbackend = [{ address = %q }]\n\n", name, vip, port, extra, backend)
	}
	mainText := func(b string) []byte {
		return []byte("include = [\"more.toml\"]\n[daemon]\nwatch = false\n\n" + svc("a", "192.0.2.1", 80, "", "10.0.0.1") + b)
	}
	b := svc("b", "192.0.2.2", 80, "", "10.0.0.2")
	c := svc("c", "192.0.2.3", 80, "", "10.0.0.3")
	d := svc("d", "192.0.2.4", 80, "", "10.0.0.4")
	if err := os.WriteFile(main, mainText(b), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(more, []byte(c+d), 0o644); err != nil {
		t.Fatal(err)
	}
	base, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, file string
		data       []byte
		bad        bool
	}{
		{"name", more, []byte(svc("a", "192.0.2.3", 80, "", "10.0.0.3") + d), true},
		{"key", more, []byte(svc("c", "192.0.2.1", 80, "", "10.0.0.3") + d), true},
		{"announce", more, []byte(svc("c", "192.0.2.1", 81, "announce = false\n", "10.0.0.3") + d), true},
		{"vip on a backend", more, []byte(svc("c", "10.0.0.1", 80, "", "10.0.0.3") + d), true},
		{"backend on a vip", more, []byte(svc("c", "192.0.2.3", 80, "", "192.0.2.2") + d), true},
		{"main: name", main, mainText(svc("c", "192.0.2.2", 80, "", "10.0.0.2")), true},
		{"main: backend on a vip", main, mainText(svc("b", "192.0.2.2", 80, "", "192.0.2.4")), true},
		{"main: vip on a backend", main, mainText(svc("b", "10.0.0.4", 80, "", "10.0.0.2")), true},
		{"main: announce", main, mainText(svc("b", "192.0.2.3", 81, "announce = false\n", "10.0.0.2")), true},
		{"shared vip", more, []byte(svc("c", "192.0.2.1", 81, "", "10.0.0.3") + d), false},
		{"shared backend", more, []byte(svc("c", "192.0.2.3", 80, "", "10.0.0.1") + d), false},
		{"names swapped", more, []byte(svc("d", "192.0.2.3", 80, "", "10.0.0.3") + svc("c", "192.0.2.4", 80, "", "10.0.0.4")), false},
		{"main: new service", main, mainText(b + svc("e", "192.0.2.5", 80, "", "10.0.0.5")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, delta, err := ParseFrom(base, tc.file, tc.data)
			texts := base.Texts()
			for i := range texts {
				if texts[i].File == tc.file {
					texts[i].Data = tc.data
				}
			}
			want, wantErr := parseWhole(texts[0], func(*Config) ([]includedText, error) {
				return []includedText{{texts[1], 0}}, nil
			})
			if diff := sameParse(got, err, want, wantErr); diff != "" {
				t.Fatal(diff)
			}
			if tc.bad != (err != nil) {
				t.Fatalf("err %v, want one: %v", err, tc.bad)
			}
			if err == nil {
				checkDelta(t, base, got, delta)
				if delta.Full || delta.NewTo-delta.From > 2 {
					t.Fatalf("delta %+v", delta)
				}
			}
		})
	}
}
