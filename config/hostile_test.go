package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostileSvc is a [[service]] block named name on vip with one backend.
func hostileSvc(name, vip, backend string) string {
	return fmt.Sprintf("[[service]]\nname = %q\nvip = %q\nport = 80\nbackend = [{ address = %q }]\n", name, vip, backend)
}

// TestBackendOnVIPEdit checks that an incremental parse refuses an edit
// that puts a backend on a VIP, or a VIP on a backend, as a whole parse
// does, and that the rejected edit leaves its base usable.
func TestBackendOnVIPEdit(t *testing.T) {
	base := hostileSvc("a", "192.0.2.1", "10.0.0.1") + hostileSvc("b", "192.0.2.2", "10.0.0.2") + hostileSvc("c", "192.0.2.3", "10.0.0.3")
	for _, tt := range []struct {
		name, old, new, want string
	}{
		{"backend on vip", `address = "10.0.0.3"`, `address = "192.0.2.1"`,
			`t.toml:15: service "c": backend "192.0.2.1:80": address 192.0.2.1 is the vip of service "a"`},
		{"backend on later vip", `address = "10.0.0.1"`, `address = "192.0.2.3"`,
			`t.toml:13: service "c": vip 192.0.2.3 is the address of backend "192.0.2.3:80" of service "a"`},
		{"vip on backend", `vip = "192.0.2.2"`, `vip = "10.0.0.1"`,
			`t.toml:8: service "b": vip 10.0.0.1 is the address of backend "10.0.0.1:80" of service "a"`},
		{"vip on later backend", `vip = "192.0.2.2"`, `vip = "10.0.0.3"`,
			`t.toml:15: service "c": backend "10.0.0.3:80": address 10.0.0.3 is the vip of service "b"`},
		{"backend on own vip", `address = "10.0.0.2"`, `address = "192.0.2.2:8080"`,
			`t.toml:10: service "b": backend "192.0.2.2:8080": address 192.0.2.2 is the vip of service "b"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prev, err := Parse("t.toml", []byte(base))
			if err != nil {
				t.Fatal(err)
			}
			edited := strings.Replace(base, tt.old, tt.new, 1)
			if edited == base {
				t.Fatalf("%q is not in the base", tt.old)
			}
			if _, _, err := ParseFrom(prev, "t.toml", []byte(edited)); errString(err) != tt.want {
				t.Fatalf("ParseFrom:\n got %v\nwant %s", err, tt.want)
			}
			// The rejected edit must leave prev's index as it was: a
			// valid edit then still takes the incremental path (a
			// conflict left in the index would make it parse whole,
			// with a full Delta).
			fixed := strings.Replace(base, `address = "10.0.0.3"`, `address = "10.0.0.30"`, 1)
			got, d, err := ParseFrom(prev, "t.toml", []byte(fixed))
			want, wantErr := parseWholeFile("t.toml", []byte(fixed))
			if diff := sameParse(got, err, want, wantErr); diff != "" || err != nil {
				t.Fatalf("valid edit after a rejected one: %v %s", err, diff)
			}
			if d != (Delta{From: 2, OldTo: 3, NewTo: 3}) {
				t.Fatalf("valid edit after a rejected one: delta %+v, want service 3 only", d)
			}
		})
	}
}

// TestBackendOnVIPIncluded checks the rule across files: a backend of an
// included file on the main file's VIP, and an edit of an included file
// that makes one.
func TestBackendOnVIPIncluded(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	incl := filepath.Join(dir, "services.d", "x.toml")
	mainText := "include = [\"services.d/*.toml\"]\n" + hostileSvc("a", "192.0.2.1", "10.0.0.1")
	writeFile(t, main, mainText)
	writeFile(t, incl, hostileSvc("x", "192.0.2.9", "192.0.2.1:8080"))
	want := incl + `:5: service "x": backend "192.0.2.1:8080": address 192.0.2.1 is the vip of service "a"`
	if _, err := Load(main); errString(err) != want {
		t.Fatalf("Load:\n got %v\nwant %s", err, want)
	}

	// Incremental parses of either file.
	writeFile(t, incl, hostileSvc("x", "192.0.2.9", "10.0.0.9"))
	base, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = ParseFrom(base, incl, []byte(hostileSvc("x", "192.0.2.9", "192.0.2.1")))
	if want := incl + `:5: service "x": backend "192.0.2.1:80": address 192.0.2.1 is the vip of service "a"`; errString(err) != want {
		t.Fatalf("ParseFrom of the included file:\n got %v\nwant %s", err, want)
	}
	// An edit of the main file that moves its VIP onto the included
	// file's backend: the main file's services come first, so the error
	// is on the backend.
	_, _, err = ParseFrom(base, main, []byte(strings.Replace(mainText, `vip = "192.0.2.1"`, `vip = "10.0.0.9"`, 1)))
	if want := incl + `:5: service "x": backend "10.0.0.9:80": address 10.0.0.9 is the vip of service "a"`; errString(err) != want {
		t.Fatalf("ParseFrom of the main file:\n got %v\nwant %s", err, want)
	}
}

// TestDefaultNames checks that the names vipd gives unnamed services pass
// the rule for names, for the longest forms an address can be written in,
// and that a user may write such a name out.
func TestDefaultNames(t *testing.T) {
	var b strings.Builder
	for i, s := range []struct{ proto, vip, backend string }{
		{"tcp", "192.0.2.10", "10.0.0.1"},
		{"udp", "203.0.113.255", "10.0.0.1"},
		{"sctp", "2001:0db8:0000:0000:0000:0000:0000:0010", "fd00::1"},
		{"sctp", "2001:db8::ffff:192.0.2.10", "fd00::1"},
		{"sctp", "0000:0000:0000:0000:0000:ffff:192.0.2.11", "10.0.0.1"},
		{"tcp", "2001:DB8::A", "fd00::1"},
	} {
		fmt.Fprintf(&b, "[[service]]\nprotocol = %q\nvip = %q\nport = %d\nbackend = [{ address = %q }]\n", s.proto, s.vip, 65535-i, s.backend)
	}
	b.WriteString("[[service]]\nfwmark = 4294967295\nbackend = [{ address = \"10.0.0.1\" }]\n")
	b.WriteString("[[service]]\nnodeport = true\nprotocol = \"sctp\"\nport = 65535\nbackend = [{ address = \"10.0.0.1\" }]\n")
	cfg, err := Parse("t.toml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Spec.Services) != 8 {
		t.Fatalf("%d services, want 8", len(cfg.Spec.Services))
	}
	var named strings.Builder
	for i, vs := range cfg.Spec.Services {
		if err := validServiceName(vs.Name); err != nil {
			t.Errorf("default name of service %d: %v", i+1, err)
		}
		fmt.Fprintf(&named, "[[service]]\nname = %q\n", vs.Name)
	}
	longest := "sctp-0000:0000:0000:0000:0000:ffff:192.0.2.11-65531"
	if cfg.Spec.Services[4].Name != longest {
		t.Errorf("default name %q, want %q", cfg.Spec.Services[4].Name, longest)
	}
	// The same services, named explicitly with their default names.
	explicit := strings.ReplaceAll(b.String(), "[[service]]\n", "")
	blocks := strings.Split(named.String(), "[[service]]\n")[1:]
	var out strings.Builder
	for i, body := range strings.SplitAfter(explicit, "}]\n")[:8] {
		out.WriteString("[[service]]\n" + blocks[i] + body)
	}
	again, err := Parse("t.toml", []byte(out.String()))
	if err != nil {
		t.Fatalf("default names written out: %v", err)
	}
	for i := range again.Spec.Services {
		if g, w := again.Spec.Services[i].Name, cfg.Spec.Services[i].Name; g != w {
			t.Errorf("service %d: name %q, want %q", i+1, g, w)
		}
	}
}

// TestNameLength checks the bound on names: 64 bytes pass, 65 do not.
func TestNameLength(t *testing.T) {
	for _, n := range []int{1, 63, 64} {
		name := strings.Repeat("n", n)
		if _, err := Parse("t.toml", []byte(hostileSvc(name, "192.0.2.1", "10.0.0.1"))); err != nil {
			t.Errorf("name of %d bytes: %v", n, err)
		}
	}
	name := strings.Repeat("n", 65)
	want := `t.toml:2: service "` + name + `": name "nnnnnnnnnnnnnnnnnnnn"... is longer than 64 bytes`
	if _, err := Parse("t.toml", []byte(hostileSvc(name, "192.0.2.1", "10.0.0.1"))); errString(err) != want {
		t.Errorf("name of 65 bytes:\n got %v\nwant %s", err, want)
	}
}

// hostileSize is the size of the generated hostile files.
const hostileSize = 400 << 10

// repeatTo returns prefix, then unit repeated (with "#" replaced by the
// repetition's number) until the text is n bytes long, then suffix.
func repeatTo(n int, prefix, unit, suffix string) []byte {
	var b bytes.Buffer
	b.WriteString(prefix)
	for i := 0; b.Len()+len(suffix) < n; i++ {
		b.WriteString(strings.ReplaceAll(unit, "#", strconv.Itoa(i)))
	}
	b.WriteString(suffix)
	return b.Bytes()
}

// hostileShape is a file shaped to make a parser's cost grow faster than
// the file's size, generated at any size n.
type hostileShape struct {
	name string
	gen  func(n int) []byte
	// want is the error, or a part of it ("" for a file that parses).
	want string
}

var hostileShapes = []hostileShape{
	// Past the limits: refused by the scan of limits.go.
	{"deep arrays", func(n int) []byte { return []byte("x = " + strings.Repeat("[", n/2) + strings.Repeat("]", n/2) + "\n") },
		"t.toml:1:37: arrays and inline tables nested more than 32 deep"},
	{"deep inline tables", func(n int) []byte {
		return []byte("x = " + strings.Repeat("{a=", n/4) + "1" + strings.Repeat("}", n/4) + "\n")
	}, "t.toml:1:27: key has 9 parts with those of its table and inline tables, more than 8"},
	{"dotted key", func(n int) []byte { return []byte("\n" + strings.Repeat("a.", n/2) + "a = 1\n") },
		"key has %d dotted parts, more than 8"},
	{"table header", func(n int) []byte { return []byte("[" + strings.Repeat("a.", n/2) + "a]\n") },
		"table header has %d dotted parts, more than 8"},
	{"array table header", func(n int) []byte { return []byte("[[" + strings.Repeat("a.", n/2) + "a]]\n") },
		"table header has %d dotted parts, more than 8"},
	{"long key", func(n int) []byte { return []byte(strings.Repeat("k", n) + " = 1\n") },
		"t.toml:1:1: key is %d bytes long, more than 128"},
	{"flat array", func(n int) []byte { return repeatTo(n, "x = [", "1,", "1]\n") },
		"t.toml:1:131078: array has more than 65536 elements"},
	{"deep arrays in an array", func(n int) []byte {
		return repeatTo(n, "x = [", strings.Repeat("[", 40)+strings.Repeat("]", 40)+",", "]\n")
	}, "t.toml:1:37: arrays and inline tables nested more than 32 deep"},
	{"deep arrays in a service", func(n int) []byte {
		return []byte(hostileSvc("a", "192.0.2.1", "10.0.0.1") + "[[service]]\nname = " + strings.Repeat("[", n/2) + strings.Repeat("]", n/2) + "\n")
	}, "t.toml:7:40: arrays and inline tables nested more than 32 deep"},

	// Within the limits, at their worst: refused by the decoders or the
	// validation, at a cost in proportion to the size.
	{"many keys under a long header", func(n int) []byte {
		p := strings.Repeat("p", 15)
		return repeatTo(n, "["+strings.Repeat(p+".", 6)+p+"]\n", "b#=1\n", "")
	}, `t.toml:1: unknown key "ppppppppppppppp`},
	{"many keys in deep inline tables", func(n int) []byte {
		return repeatTo(n, "x = "+strings.Repeat("{a = ", 6)+"{", "b#=1,", "c=1"+strings.Repeat("}", 7)+"\n")
	}, `t.toml:1: unknown key "x"`},
	{"many keys in a service", func(n int) []byte { return repeatTo(n, "[[service]]\n", "b#=1\n", "") },
		`t.toml:1: service "": vip is missing`},
	{"many tables", func(n int) []byte { return repeatTo(n, "", "[a#]\n", "") }, `t.toml:1: unknown key "a0"`},
	{"many array tables", func(n int) []byte { return repeatTo(n, "", "[[a]]\n", "") }, `t.toml:1: unknown key "a"`},
	{"arrays 32 deep", func(n int) []byte {
		return repeatTo(n, "", "x#="+strings.Repeat("[", 32)+strings.Repeat("]", 32)+"\n", "")
	}, `t.toml:1: unknown key "x0"`},
	{"long strings of escapes", func(n int) []byte {
		return repeatTo(n, "", "s# = \""+strings.Repeat(`\u00e9\n\t\\\"`, 300)+"\"\n", "")
	}, `t.toml:1: unknown key "s0"`},

	// Large and valid.
	{"many services", func(n int) []byte {
		var b strings.Builder
		for i := 0; b.Len() < n; i++ {
			fmt.Fprintf(&b, "[[service]]\nvip = \"10.1.%d.%d\"\nport = 80\nbackend = [{ address = \"10.2.0.1\" }, { address = \"10.2.0.2\", weight = 2 }]\n", i/250, i%250+1)
		}
		return []byte(b.String())
	}, ""},
	{"a service of many backends", func(n int) []byte {
		var b strings.Builder
		b.WriteString("[[service]]\nvip = \"192.0.2.1\"\nport = 80\nbackend = [\n")
		for i := 0; b.Len() < n-2; i++ {
			fmt.Fprintf(&b, "{ address = \"10.%d.%d.%d\" },\n", i>>16&255, i>>8&255, i&255)
		}
		b.WriteString("]\n")
		return []byte(b.String())
	}, ""},
	{"a long check body", func(n int) []byte {
		return repeatTo(n, hostileSvc("a", "192.0.2.1", "10.0.0.1")+"check = { type = \"http\", body = \"", `\u00e9\n\t\\\"`, "\" }\n")
	}, ""},
}

// The bounds on one parse of a hostile file of hostileSize bytes: memory
// allocated in all and processor time. Allocation is deterministic, and
// bounds the memory a parse can hold at any time. Wall time on a loaded
// machine is not, so the test bounds the processor time the process spent
// instead (the garbage collector's workers included), which other
// processes do not inflate; the quadratic parses it guards against took
// from 3.5 s (go-toml, 400 KB of short keys) to minutes and tens of GB.
const (
	hostileMaxAlloc = 100 << 20
	hostileMaxCPU   = 2 * time.Second
)

// parseCost returns the memory allocated and the processor time spent by
// f, and its wall time.
func parseCost(t *testing.T, f func()) (alloc uint64, cpu, wall time.Duration) {
	t.Helper()
	runtime.GC()
	var m0, m1 runtime.MemStats
	var r0, r1 syscall.Rusage
	runtime.ReadMemStats(&m0)
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f()
	wall = time.Since(start)
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r1); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&m1)
	tv := func(r *syscall.Rusage) time.Duration {
		return time.Duration(r.Utime.Nano() + r.Stime.Nano())
	}
	return m1.TotalAlloc - m0.TotalAlloc, tv(&r1) - tv(&r0), wall
}

// TestHostileFiles parses each hostile shape at 400 KB and checks that it
// is refused with its error (or parses, for the valid ones) within the
// bounds, and that its cost grows in proportion to its size: a file of
// half the size must allocate about half as much (allocation counts are
// deterministic, so this catches a parse that grows faster than the file
// without depending on timing).
func TestHostileFiles(t *testing.T) {
	for _, sh := range hostileShapes {
		t.Run(sh.name, func(t *testing.T) {
			var allocs [2]uint64
			for i, n := range []int{hostileSize / 2, hostileSize} {
				data := sh.gen(n)
				var err error
				alloc, cpu, wall := parseCost(t, func() { _, err = Parse("t.toml", data) })
				allocs[i] = alloc
				if i == 0 {
					continue
				}
				t.Logf("%d bytes: %.1f MiB allocated, %v processor time, %v", len(data), float64(alloc)/(1<<20), cpu.Round(time.Millisecond), wall.Round(time.Millisecond))
				checkHostileErr(t, sh, len(data), err)
				if alloc > hostileMaxAlloc {
					t.Errorf("%d bytes: %.1f MiB allocated, more than %d MiB", len(data), float64(alloc)/(1<<20), hostileMaxAlloc>>20)
				}
				if cpu > hostileMaxCPU {
					t.Errorf("%d bytes: %v of processor time, more than %v", len(data), cpu, hostileMaxCPU)
				}
			}
			if allocs[1] > allocs[0]*5/2+1<<20 {
				t.Errorf("%d bytes allocated for %d bytes of text, %d for half of it: the cost grows faster than the text", allocs[1], hostileSize, allocs[0])
			}
		})
	}
}

// checkHostileErr checks the error of the parse of a hostile file of n
// bytes.
func checkHostileErr(t *testing.T, sh hostileShape, n int, err error) {
	t.Helper()
	if sh.want == "" {
		if err != nil {
			t.Fatalf("a valid file of %d bytes: %.300v", n, err)
		}
		return
	}
	want := sh.want
	if strings.Contains(want, "%d") {
		// The dotted keys and long keys: the count depends on n.
		if err == nil {
			t.Fatalf("no error, want %s", want)
		}
		first := strings.SplitN(err.Error(), "\n", 2)[0]
		var got int
		pre, post, _ := strings.Cut(want, "%d")
		i := strings.Index(first, pre)
		if i < 0 || !strings.HasSuffix(first, post) {
			t.Fatalf("error %.300v\nwant %s", err, want)
		}
		fmt.Sscan(first[i+len(pre):], &got)
		if got < n/3 {
			t.Fatalf("error %.300v: the count is too small for %d bytes", err, n)
		}
		return
	}
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %.300v\nwant %s", err, want)
	}
}

// TestHostileIncluded checks that the limits apply to an included file,
// whether it is read with the main file (Load), reloaded on its own
// (ParseFrom, as the watcher does), or read again with every file
// (Reload), and that each path reports the included file's name and line.
func TestHostileIncluded(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	incl := filepath.Join(dir, "services.d", "a.toml")
	writeFile(t, main, "include = [\"services.d/*.toml\"]\n"+hostileSvc("m", "192.0.2.1", "10.0.0.1"))
	good := hostileSvc("a", "192.0.2.2", "10.0.0.2")
	writeFile(t, incl, good)
	base, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	deep := []byte(good + "[[service]]\nname = \"b\"\nport = " + strings.Repeat("[", hostileSize/2) + strings.Repeat("]", hostileSize/2) + "\n")
	want := incl + ":8:40: arrays and inline tables nested more than 32 deep"

	var got error
	alloc, cpu, _ := parseCost(t, func() { _, _, got = ParseFrom(base, incl, deep) })
	if errString(got) != want {
		t.Fatalf("ParseFrom:\n got %.300v\nwant %s", got, want)
	}
	if alloc > hostileMaxAlloc || cpu > hostileMaxCPU {
		t.Errorf("ParseFrom: %d bytes allocated, %v of processor time", alloc, cpu)
	}
	// A new file that an include pattern matches.
	added := filepath.Join(dir, "services.d", "b.toml")
	if _, _, err := ParseFrom(base, added, deep); errString(err) != added+":8:40: arrays and inline tables nested more than 32 deep" {
		t.Fatalf("ParseFrom of a new file: %.300v", err)
	}
	writeFile(t, incl, string(deep))
	if _, _, err := Reload(base); errString(err) != want {
		t.Fatalf("Reload:\n got %.300v\nwant %s", err, want)
	}
	if _, err := Load(main); errString(err) != want {
		t.Fatalf("Load:\n got %.300v\nwant %s", err, want)
	}
	// The main file, edited on its own.
	dotted := "include = [\"services.d/*.toml\"]\n" + strings.Repeat("a.", 20000) + "a = 1\n"
	if _, _, err := ParseFrom(base, main, []byte(dotted)); errString(err) != main+":2:1: key has 20001 dotted parts, more than 8" {
		t.Fatalf("ParseFrom of the main file: %.300v", err)
	}
}

// TestHostileFixtures loads the files of testdata/hostile, each of which
// says on its first line the error it must be refused with.
func TestHostileFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/hostile/*.toml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			first, _, _ := bytes.Cut(data, []byte("\n"))
			want, ok := strings.CutPrefix(string(first), "# want: ")
			if !ok {
				t.Fatalf("the first line does not say what error to want")
			}
			if _, err := Load(file); errString(err) != file+":"+want {
				t.Fatalf("Load:\n got %.300v\nwant %s:%s", err, file, want)
			}
		})
	}
}

// TestPositionsLinear checks that the position index, which the limits
// keep from deep files, costs memory in proportion to the file even so:
// indexing a file twice as deep allocates about twice as much, and lines
// are still found at depth.
func TestPositionsLinear(t *testing.T) {
	deep := func(n int) []byte {
		return []byte("[[service]]\nname = \"a\"\nx = " + strings.Repeat("[{a = ", n) + "\n" + strings.Repeat("}]", n) + "\n")
	}
	var allocs [2]uint64
	for i, n := range []int{25000, 50000} {
		var p *positions
		data := deep(n)
		allocs[i], _, _ = parseCost(t, func() { p = indexPositions(data) })
		if l := p.line("service.0.x.0.a.0.a.0.a"); l != 3 {
			t.Errorf("depth %d: line %d, want 3", n, l)
		}
		if l := p.line("service.0.name"); l != 2 {
			t.Errorf("depth %d: name on line %d, want 2", n, l)
		}
		// The key and the inline table that is its array's element.
		if got := p.matching([]string{"service", "x", "a", "a"}); !slices.Equal(got, []int{3, 3}) {
			t.Errorf("depth %d: matching %v, want [3 3]", n, got)
		}
		t.Logf("depth %d, %d bytes: %d bytes allocated", n, len(data), allocs[i])
		if i == 1 && allocs[1] > uint64(len(data))*200 {
			t.Errorf("%d bytes allocated for %d bytes of text", allocs[1], len(data))
		}
	}
	if allocs[1] > allocs[0]*5/2 {
		t.Errorf("%d bytes allocated for depth 50,000, %d for 25,000: the index grows faster than the file", allocs[1], allocs[0])
	}
}
