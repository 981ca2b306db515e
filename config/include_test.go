package config

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// tree is a configuration laid out in files: a main file and included
// files, each with its services.
type tree struct {
	dir   string
	main  string // the main file's text
	files map[string]scenario
}

func (tr *tree) path(name string) string { return filepath.Join(tr.dir, name) }

func (tr *tree) write(t *testing.T, name string) []byte {
	t.Helper()
	var data []byte
	if name == "vipd.toml" {
		data = []byte(tr.main)
	} else {
		data = tr.files[name].text()
	}
	p := tr.path(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	// Rename into place, as the daemon's users are told to.
	tmp := filepath.Join(tr.dir, ".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	return data
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sameTexts reports how the files of got and want differ.
func sameTexts(got, want *Config) string {
	if got == nil || want == nil {
		return ""
	}
	g, w := got.Texts(), want.Texts()
	if !reflect.DeepEqual(g, w) {
		names := func(ts []Text) []string {
			var out []string
			for _, t := range ts {
				out = append(out, t.File)
			}
			return out
		}
		return fmt.Sprintf("files:\n got %v\nwant %v", names(g), names(w))
	}
	return ""
}

// TestInclude reads services from included files: in pattern order, each
// pattern's files in lexical order, a file matched twice read once, the
// main file never included again; the result is the configuration of one
// file holding the same services.
func TestInclude(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	s := newScenario(6)
	part := func(from, to int) string {
		return string(scenario{services: s.services[from:to]}.text())
	}
	writeFile(t, main, "# main\ninclude = [\"conf.d/*.toml\", \"last.toml\", \"*.toml\"]\n"+s.daemon+part(0, 1))
	writeFile(t, filepath.Join(dir, "conf.d", "b.toml"), part(3, 5))
	writeFile(t, filepath.Join(dir, "conf.d", "a.toml"), part(1, 3))
	writeFile(t, filepath.Join(dir, "conf.d", "notes.txt"), "not toml")
	writeFile(t, filepath.Join(dir, "last.toml"), part(5, 6))
	cfg, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	one, err := Parse("one.toml", s.text())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Spec, one.Spec) || !reflect.DeepEqual(cfg.Health, one.Health) || !reflect.DeepEqual(cfg.Daemon, one.Daemon) {
		t.Fatalf("included configuration differs from the one file:\n got %+v\nwant %+v", cfg.Spec, one.Spec)
	}
	wantInclude := []string{filepath.Join(dir, "conf.d/*.toml"), filepath.Join(dir, "last.toml"), filepath.Join(dir, "*.toml")}
	if !slices.Equal(cfg.Include, wantInclude) {
		t.Fatalf("include = %q, want %q", cfg.Include, wantInclude)
	}
	var files []string
	for _, tx := range cfg.Texts() {
		files = append(files, strings.TrimPrefix(tx.File, dir+"/"))
	}
	if want := []string{"vipd.toml", "conf.d/a.toml", "conf.d/b.toml", "last.toml"}; !slices.Equal(files, want) {
		t.Fatalf("files = %q, want %q", files, want)
	}
	if cfg.rankOf(filepath.Join(dir, "conf.d", "new.toml")) < 0 || cfg.rankOf(filepath.Join(dir, "conf.d", "x.txt")) >= 0 || cfg.rankOf(main) >= 0 {
		t.Fatal("rankOf is wrong")
	}
	// The block path took every file.
	for _, p := range cfg.parts {
		if p.chunks == nil {
			t.Errorf("%s: not read block by block", p.file)
		}
	}
	// A relative main path gives relative patterns.
	t.Chdir(dir)
	rel, err := Load("vipd.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rel.Include, []string{"conf.d/*.toml", "last.toml", "*.toml"}) || len(rel.Spec.Services) != 6 {
		t.Fatalf("relative: include %q, %d services", rel.Include, len(rel.Spec.Services))
	}
}

// TestIncludeErrors names the included file and the line of each problem,
// and the main file's include line for problems with the patterns.
func TestIncludeErrors(t *testing.T) {
	svc := func(name, vip string) string {
		return fmt.Sprintf("[[service]]\nname = %q\nvip = %q\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n", name, vip)
	}
	for _, tc := range []struct {
		name  string
		main  string
		files map[string]string
		want  string // with D for the directory
	}{{
		name:  "unknown key",
		main:  "include = [\"d/*.toml\"]\n",
		files: map[string]string{"d/a.toml": "\n" + svc("a", "192.0.2.1") + "colour = 1\n"},
		want:  "D/d/a.toml:7: unknown key \"service.colour\"",
	}, {
		name:  "daemon in an included file",
		main:  "include = [\"d/*.toml\"]\n",
		files: map[string]string{"d/a.toml": "[daemon]\nwatch = false\n" + svc("a", "192.0.2.1")},
		want:  "D/d/a.toml:1: daemon belongs in the main file D/vipd.toml: an included file holds [[service]] tables only",
	}, {
		name:  "include in an included file",
		main:  "include = [\"d/*.toml\"]\n",
		files: map[string]string{"d/a.toml": "include = [\"x\"]\n" + svc("a", "192.0.2.1")},
		want:  "D/d/a.toml:1: include belongs in the main file D/vipd.toml: an included file holds [[service]] tables only",
	}, {
		name:  "a name used in two files",
		main:  "include = [\"d/*.toml\"]\n" + svc("web", "192.0.2.1"),
		files: map[string]string{"d/a.toml": "# a\n" + svc("ok", "192.0.2.2"), "d/b.toml": "\n\n" + svc("web", "192.0.2.3")},
		want:  "D/d/b.toml:4: service \"web\": name already used by service 1 of D/vipd.toml",
	}, {
		name:  "a bad value",
		main:  "include = [\"d/*.toml\"]\n",
		files: map[string]string{"d/a.toml": svc("a", "192.0.2.1") + svc("b", "not-an-ip")},
		want:  "D/d/a.toml:8: service \"b\": vip: \"not-an-ip\" is not an IP address",
	}, {
		name:  "a syntax error",
		main:  "include = [\"d/*.toml\"]\n",
		files: map[string]string{"d/a.toml": svc("a", "192.0.2.1") + "[[service]\n"},
		want:  "D/d/a.toml:7: service: expected end of table array name delimiter",
	}, {
		name: "a missing file",
		main: "# services\ninclude = [\"d/*.toml\", \"extra.toml\"]\n",
		want: "D/vipd.toml:2: include \"D/extra.toml\": file does not exist",
	}, {
		name: "a wildcard directory",
		main: "include = [\"*/a.toml\"]\n",
		want: "D/vipd.toml:1: include: \"D/*/a.toml\": only the file name may hold wildcards (*, ?, [)",
	}, {
		name: "a bad pattern",
		main: "include = [\"d/[.toml\"]\n",
		want: "D/vipd.toml:1: include: \"D/d/[.toml\": syntax error in pattern",
	}, {
		name: "a missing directory, watched",
		main: "# services\ninclude = [\"d/*.toml\", \"nodir/*.toml\"]\n",
		want: "D/vipd.toml:2: include: \"D/nodir/*.toml\": directory D/nodir does not exist, and with watch = true vipd watches it for files: create it, or set watch = false",
	}, {
		name:  "a file where the directory should be, watched",
		main:  "include = [\"d/a.toml/*.toml\"]\n",
		files: map[string]string{"d/a.toml": svc("a", "192.0.2.1")},
		want:  "D/vipd.toml:1: include: \"D/d/a.toml/*.toml\": D/d/a.toml is not a directory",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "vipd.toml"), tc.main)
			if err := os.MkdirAll(filepath.Join(dir, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			for name, data := range tc.files {
				writeFile(t, filepath.Join(dir, name), data)
			}
			_, err := Load(filepath.Join(dir, "vipd.toml"))
			want := strings.ReplaceAll(tc.want, "D/", dir+"/")
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("error:\n got %v\nwant %s", err, want)
			}
		})
	}
}

// TestIncludeMissingDirUnwatched: without watching, a pattern's missing
// directory is a glob that matches nothing, as an empty one is.
func TestIncludeMissingDirUnwatched(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	writeFile(t, main, "include = [\"nodir/*.toml\"]\n[daemon]\nwatch = false\n")
	cfg, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Include) != 1 || len(cfg.Spec.Services) != 0 {
		t.Errorf("include %q, %d services", cfg.Include, len(cfg.Spec.Services))
	}
	// The same file watched is refused, by the whole parse and by the
	// incremental one from the unwatched configuration.
	watched := []byte("include = [\"nodir/*.toml\"]\n[daemon]\nwatch = true\n")
	if _, _, err := ParseFrom(cfg, main, watched); err == nil || !strings.Contains(err.Error(), "nodir does not exist") {
		t.Errorf("ParseFrom: %v", err)
	}
	writeFile(t, main, string(watched))
	if _, err := Load(main); err == nil || !strings.Contains(err.Error(), "nodir does not exist") {
		t.Errorf("Load: %v", err)
	}
}

// TestIncludeScenario edits a configuration of several files step by step,
// as an operator and a watcher would (one file at a time, renamed into
// place), and checks each result against the whole parse of the files on
// disk: the same configuration or the same errors, a delta that covers
// exactly the edited file's changed services, and the edited file's
// services alone parsed again.
func TestIncludeScenario(t *testing.T) {
	tr := &tree{
		dir:   t.TempDir(),
		main:  "include = [\"conf.d/*.toml\", \"last*.toml\"]\n[daemon]\ninterface = \"lb0\"\n",
		files: map[string]scenario{},
	}
	next := 0
	newService := func() scenarioService {
		i := next
		next++
		return scenarioService{
			id: i, name: fmt.Sprintf("svc%d", i), vip: fmt.Sprintf("192.0.2.%d", i/4+1), port: 80 + i%4,
			weights: []int{1, 2}, check: i%5 == 0,
		}
	}
	names := []string{"conf.d/a.toml", "conf.d/b.toml", "conf.d/c.toml", "conf.d/d.toml", "last.toml"}
	for _, n := range names[:3] {
		var s scenario
		for range 4 {
			s.services = append(s.services, newService())
		}
		tr.files[n] = s
		tr.write(t, n)
	}
	tr.write(t, "vipd.toml")
	mainPath := tr.path("vipd.toml")
	base, err := Load(mainPath)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(8, 8))
	present := func() []string {
		var out []string
		for _, n := range names {
			if _, ok := tr.files[n]; ok {
				out = append(out, n)
			}
		}
		return out
	}
	for step := range 400 {
		saved := map[string]scenario{}
		for n, s := range tr.files {
			saved[n] = s.clone()
		}
		savedMain := tr.main
		var (
			name    string
			removed bool
			bad     bool // the edit must be rejected
		)
		files := present()
		switch op := rng.IntN(12); {
		case op < 5 && len(files) > 0: // a weight
			name = files[rng.IntN(len(files))]
			s := tr.files[name]
			if len(s.services) == 0 {
				s.services = append(s.services, newService())
			} else {
				vs := &s.services[rng.IntN(len(s.services))]
				vs.weights[rng.IntN(len(vs.weights))] = rng.IntN(100)
			}
			tr.files[name] = s
		case op == 5 && len(files) > 0: // a service added
			name = files[rng.IntN(len(files))]
			s := tr.files[name].clone()
			s.services = slices.Insert(s.services, rng.IntN(len(s.services)+1), newService())
			tr.files[name] = s
		case op == 6 && len(files) > 0: // a service removed
			name = files[rng.IntN(len(files))]
			s := tr.files[name].clone()
			if len(s.services) > 0 {
				s.services = slices.Delete(s.services, 0, 1)
			}
			tr.files[name] = s
		case op == 7: // a file added or rewritten
			name = names[rng.IntN(len(names))]
			var s scenario
			for range rng.IntN(4) {
				s.services = append(s.services, newService())
			}
			tr.files[name] = s
		case op == 8 && len(files) > 0: // a file removed
			name = files[rng.IntN(len(files))]
			delete(tr.files, name)
			removed = true
		case op == 9 && len(files) > 1: // a name taken from another file
			name = files[0]
			other := tr.files[files[len(files)-1]]
			s := tr.files[name].clone()
			if len(s.services) == 0 || len(other.services) == 0 {
				continue
			}
			s.services[0].name = other.services[0].name
			tr.files[name] = s
			bad = true
		case op == 10: // the main file's settings, or a comment
			name = "vipd.toml"
			if rng.IntN(2) == 0 {
				tr.main = strings.Replace(tr.main, "lb0", "lb1", 1)
				if tr.main == savedMain {
					tr.main = strings.Replace(tr.main, "lb1", "lb0", 1)
				}
			} else {
				tr.main = "# edit\n" + tr.main
			}
		default: // a comment in an included file
			if len(files) == 0 {
				continue
			}
			name = files[rng.IntN(len(files))]
			data := append([]byte("# note\n"), tr.files[name].text()...)
			if err := os.WriteFile(tr.path(name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var (
			got   *Config
			d     Delta
			gotEr error
		)
		if removed {
			if err := os.Remove(tr.path(name)); err != nil {
				t.Fatal(err)
			}
			got, d, gotEr = ParseRemoved(base, tr.path(name))
		} else {
			var data []byte
			if _, ok := tr.files[name]; ok || name == "vipd.toml" {
				data = tr.write(t, name)
			} else {
				data, _ = os.ReadFile(tr.path(name))
			}
			got, d, gotEr = ParseFrom(base, tr.path(name), data)
		}
		mainData, _ := os.ReadFile(mainPath)
		want, wantErr := parseWholeFile(mainPath, mainData)
		if diff := sameParse(got, gotEr, want, wantErr); diff != "" {
			t.Fatalf("step %d (%s): %s", step, name, diff)
		}
		if diff := sameTexts(got, want); diff != "" {
			t.Fatalf("step %d (%s): %s", step, name, diff)
		}
		if bad != (gotEr != nil) {
			t.Fatalf("step %d (%s): error %v, want one: %v", step, name, gotEr, bad)
		}
		if gotEr != nil {
			// The edited file is named: as the place of the error, or as
			// that of the service it conflicts with.
			if !strings.Contains(gotEr.Error(), tr.path(name)) {
				t.Fatalf("step %d: the error does not name %s: %v", step, name, gotEr)
			}
			// The operator fixes the file.
			tr.files, tr.main = saved, savedMain
			tr.write(t, name)
			continue
		}
		checkDelta(t, base, got, d)
		if name != "vipd.toml" {
			// One included file: never a full change, and at most that
			// file's services.
			if d.Full {
				t.Fatalf("step %d (%s): full delta", step, name)
			}
			if n := len(tr.files[name].services); d.NewTo-d.From > n {
				t.Fatalf("step %d (%s): delta %+v covers more than the file's %d services", step, name, d, n)
			}
		}
		base = got
	}
}

// TestIncludeReload reads every file again: one changed file gives its
// delta, several a full one, none an empty one.
func TestIncludeReload(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	s := newScenario(6)
	part := func(from, to int) string {
		return string(scenario{services: s.services[from:to]}.text())
	}
	writeFile(t, main, "include = [\"d/*.toml\"]\n")
	writeFile(t, filepath.Join(dir, "d", "a.toml"), part(0, 3))
	writeFile(t, filepath.Join(dir, "d", "b.toml"), part(3, 6))
	base, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	cfg, d, err := Reload(base)
	if err != nil || d != (Delta{}) || cfg != base {
		t.Fatalf("unchanged: %+v, %v, same config %v", d, err, cfg == base)
	}
	s.services[4].weights[0] = 9
	writeFile(t, filepath.Join(dir, "d", "b.toml"), part(3, 6))
	cfg, d, err = Reload(base)
	if err != nil || d != (Delta{From: 4, OldTo: 5, NewTo: 5}) {
		t.Fatalf("one change: %+v, %v", d, err)
	}
	if cfg.Spec.Services[4].Backends[0].Weight != 9 {
		t.Fatal("the change was not read")
	}
	s.services[0].weights[0] = 7
	writeFile(t, filepath.Join(dir, "d", "a.toml"), part(0, 3))
	if err := os.Remove(filepath.Join(dir, "d", "b.toml")); err != nil {
		t.Fatal(err)
	}
	cfg2, d, err := Reload(cfg)
	if err != nil || !d.Full || len(cfg2.Spec.Services) != 3 {
		t.Fatalf("two changes: %+v, %v", d, err)
	}
	// A broken file fails the reload and names itself.
	writeFile(t, filepath.Join(dir, "d", "c.toml"), "[[service]]\nport = 80\n")
	if _, _, err := Reload(cfg2); err == nil || !strings.HasPrefix(err.Error(), filepath.Join(dir, "d", "c.toml")+":") {
		t.Fatalf("broken file: %v", err)
	}
}

// TestIncludePatternsChange reads the files of new include patterns when
// the main file changes them.
func TestIncludePatternsChange(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	s := newScenario(4)
	writeFile(t, main, "include = [\"a/*.toml\"]\n")
	writeFile(t, filepath.Join(dir, "a", "x.toml"), string(scenario{services: s.services[:2]}.text()))
	writeFile(t, filepath.Join(dir, "b", "y.toml"), string(scenario{services: s.services[2:]}.text()))
	base, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	cfg, d, err := ParseFrom(base, main, []byte("include = [\"a/*.toml\", \"b/*.toml\"]\n"))
	if err != nil || !d.Full || len(cfg.Spec.Services) != 4 || len(cfg.Texts()) != 3 {
		t.Fatalf("%+v, %v", d, err)
	}
	// A comment in the main file changes nothing.
	cfg2, d, err := ParseFrom(cfg, main, []byte("# hi\ninclude = [\"a/*.toml\", \"b/*.toml\"]\n"))
	if err != nil || d != (Delta{}) || len(cfg2.Spec.Services) != 4 {
		t.Fatalf("comment: %+v, %v", d, err)
	}
	// A file outside the patterns is refused.
	if _, _, err := ParseFrom(cfg2, filepath.Join(dir, "c.toml"), nil); err == nil {
		t.Fatal("a file outside the patterns was taken")
	}
	// Removing a file that is not included changes nothing.
	if c, d, err := ParseRemoved(cfg2, filepath.Join(dir, "c.toml")); err != nil || c != cfg2 || d != (Delta{}) {
		t.Fatalf("removal of a stranger: %+v, %v", d, err)
	}
}
