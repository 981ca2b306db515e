package health

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	checkdesc "github.com/vipd/vipd/monitor/check"
)

func TestParseKind(t *testing.T) {
	for k := KindTCP; k <= KindExec; k++ {
		got, err := checkdesc.ParseKind(strings.ToUpper(k.String()))
		if err != nil || got != k {
			t.Errorf("checkdesc.ParseKind(%q) = %v, %v", k, got, err)
		}
	}
	if _, err := checkdesc.ParseKind("icmp"); err == nil {
		t.Error("icmp parsed")
	}
	if s, err := checkdesc.ParseState("UP"); err != nil || s != Up {
		t.Errorf("ParseState: %v %v", s, err)
	}
}

func TestSpecValidate(t *testing.T) {
	tests := []struct {
		spec Spec
		err  string
	}{
		{Spec{}, "check type is missing"},
		{Spec{Kind: KindTCP, Interval: -time.Second}, "interval -1s is shorter than 10ms"},
		{Spec{Kind: KindTCP, Interval: time.Millisecond}, "interval 1ms is shorter"},
		{Spec{Kind: KindTCP, Rise: -1}, "rise -1"},
		{Spec{Kind: KindTCP, Jitter: 0.9}, "jitter 0.9"},
		{Spec{Kind: KindTCP, Initial: 5}, "initial state"},
		{Spec{Kind: KindTCP, HTTP: HTTPOptions{Path: "/"}}, "http options do not apply to tcp checks"},
		{Spec{Kind: KindExec, Dial: DialOptions{Mark: 1}, Exec: ExecOptions{Command: "/bin/true"}}, "dial options do not apply to exec checks"},
		{Spec{Kind: KindUDP, DNS: DNSOptions{Name: "x"}}, "dns options do not apply to udp checks"},
		{Spec{Kind: KindHTTP, HTTP: HTTPOptions{Method: "GE T"}}, "http method"},
		{Spec{Kind: KindHTTP, HTTP: HTTPOptions{Status: []StatusRange{{Lo: 300, Hi: 200}}}}, "status range"},
		{Spec{Kind: KindHTTPS, HTTP: HTTPOptions{BodyRegexp: "("}}, "body regexp"},
		{Spec{Kind: KindHTTP, HTTP: HTTPOptions{Header: map[string]string{"Bad Name": "x"}}}, "header"},
		{Spec{Kind: KindHTTP, HTTP: HTTPOptions{Header: map[string]string{"host": "x"}}}, "set by the host option"},
		{Spec{Kind: KindDNS, DNS: DNSOptions{Type: "WKS"}}, "dns type"},
		{Spec{Kind: KindExec}, "exec command is missing"},
		{Spec{Kind: KindExec, Exec: ExecOptions{Command: "true"}}, "not an absolute path"},
		{Spec{Kind: KindExec, Exec: ExecOptions{Command: "/bin/true", Env: []string{"PATH=/tmp"}}}, "may not set PATH"},
		{Spec{Kind: KindTCP, Dial: DialOptions{Device: "a-very-long-interface-name"}}, "not an interface name"},
	}
	for _, tt := range tests {
		err := tt.spec.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%+v: %v, want error containing %q", tt.spec, err, tt.err)
		}
	}
	for _, s := range []Spec{
		{Kind: KindTCP},
		{Kind: KindHTTP, HTTP: HTTPOptions{Path: "/health?full=1", Host: "svc.example:8080"}},
		{Kind: KindHTTPS, Dial: DialOptions{Mark: 0x100}},
		{Kind: KindUDP, UDP: UDPOptions{Payload: []byte{0}}},
		{Kind: KindDNS, DNS: DNSOptions{Name: "example.com", Type: "aaaa", TCP: true}},
		{Kind: KindExec, Exec: ExecOptions{Command: "/bin/true"}},
	} {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
}

func TestSpecDefaultsAndTarget(t *testing.T) {
	s := Spec{Kind: KindTCP}.WithDefaults()
	if s.Interval != DefaultInterval || s.Timeout != DefaultTimeout || s.Rise != DefaultRise || s.Fall != DefaultFall || s.Jitter != DefaultJitter || s.Initial != Down {
		t.Errorf("defaults: %+v", s)
	}
	if s := (Spec{Kind: KindTCP, Interval: 300 * time.Millisecond}).WithDefaults(); s.Timeout != 300*time.Millisecond {
		t.Errorf("timeout %s is longer than the interval", s.Timeout)
	}
	be := netip.MustParseAddrPort("127.0.0.1:80")
	vip := netip.MustParseAddr("::1")
	for _, tt := range []struct {
		spec Spec
		want string
	}{
		{Spec{}, "127.0.0.1:80"},
		{Spec{Port: 8080}, "127.0.0.1:8080"},
		{Spec{Addr: vip}, "[::1]:80"},
		{Spec{Addr: netip.MustParseAddr("::ffff:127.0.0.2"), Port: 1}, "127.0.0.2:1"},
	} {
		if got := tt.spec.Target(be).String(); got != tt.want {
			t.Errorf("target of %+v: %s, want %s", tt.spec, got, tt.want)
		}
	}
}

// keyOnly returns the key of keyOf(spec, target).
func keyOnly(spec Spec, target netip.AddrPort) checkKey {
	k, _ := keyOf(spec, target)
	return k
}

func TestCheckKey(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:80")
	implicit := Spec{Kind: KindHTTP}
	explicit := Spec{Kind: KindHTTP, Interval: DefaultInterval, Timeout: DefaultTimeout, Rise: DefaultRise, Fall: DefaultFall,
		HTTP: HTTPOptions{Method: "GET", Path: "/", Status: []StatusRange{{Lo: 200, Hi: 399}}}}
	if keyOnly(implicit, a) != keyOnly(explicit, a) {
		t.Error("a spec with defaults spelled out is a different check")
	}
	if keyOnly(implicit, a) == keyOnly(Spec{Kind: KindHTTPS}, a) {
		t.Error("http and https checks share a key")
	}
	if keyOnly(implicit, a) == keyOnly(implicit, netip.MustParseAddrPort("127.0.0.1:81")) {
		t.Error("checks of different targets share a key")
	}
	withHeader := func(v string) Spec {
		return Spec{Kind: KindHTTP, HTTP: HTTPOptions{Header: map[string]string{"A": v, "B": "2", "C": "3"}}}
	}
	if keyOnly(withHeader("1"), a) != keyOnly(withHeader("1"), a) || keyOnly(withHeader("1"), a) == keyOnly(withHeader("2"), a) {
		t.Error("header maps do not key deterministically")
	}
}

func TestNewProber(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:80")
	for _, tt := range []struct {
		spec Spec
		want string
	}{
		{Spec{Kind: KindTCP}, "*health.TCPCheck"},
		{Spec{Kind: KindHTTP}, "*health.HTTPCheck"},
		{Spec{Kind: KindHTTPS}, "*health.HTTPCheck"},
		{Spec{Kind: KindUDP}, "*health.UDPCheck"},
		{Spec{Kind: KindDNS}, "*health.DNSCheck"},
		{Spec{Kind: KindExec, Exec: ExecOptions{Command: "/bin/true", User: testUser(t)}}, "*health.ExecCheck"},
	} {
		p, err := NewProber(tt.spec, a)
		if err != nil {
			t.Errorf("%s: %v", tt.spec.Kind, err)
			continue
		}
		if got := fmt.Sprintf("%T", p); got != tt.want {
			t.Errorf("%s: built %s, want %s", tt.spec.Kind, got, tt.want)
		}
	}
	if _, err := NewProber(Spec{Kind: KindTCP}, netip.AddrPort{}); err == nil {
		t.Error("prober without target built")
	}
	if _, err := NewProber(Spec{}, a); err == nil {
		t.Error("prober without kind built")
	}
}

// TestCheckKeyParts sets each field of a Spec in turn and checks which
// part of the check's key it changes: the target, for which a new check
// starts from its initial state, or the question or timing, across which
// an edited check keeps its state. A field missing from the table fails
// the test, so that a new field is placed.
func TestCheckKeyParts(t *testing.T) {
	part := map[string]string{
		"Kind": "target", "Addr": "target", "Port": "target",
		"Dial.Mark": "target", "Dial.Device": "target", "Dial.Source": "target",
		"Interval": "timing", "Timeout": "timing", "Rise": "timing", "Fall": "timing", "Initial": "timing", "Jitter": "timing",
	}
	for _, f := range []string{"Method", "Path", "Host", "SNI", "Header", "Status", "Body", "BodyRegexp", "InsecureSkipVerify", "CAFile", "CA", "FollowRedirects", "KeepAlive"} {
		part["HTTP."+f] = "question"
	}
	for _, f := range []string{"TCP.HalfOpen", "UDP.Payload", "UDP.Expect", "DNS.Name", "DNS.Type", "DNS.TCP", "DNS.ExpectAnswer", "DNS.NoRecursion", "Exec.Command", "Exec.Args", "Exec.Env", "Exec.User"} {
		part[f] = "question"
	}
	be := netip.MustParseAddrPort("127.0.0.1:80")
	key := func(s Spec) checkKey { k, _ := keyOf(s, s.Target(be)); return k }
	id := func(s Spec) checkID { _, id := keyOf(s, s.Target(be)); return id }
	base := Spec{Kind: KindHTTP}
	leaves := 0
	var walk func(prefix string, typ reflect.Type, index []int)
	walk = func(prefix string, typ reflect.Type, index []int) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, idx := prefix+f.Name, append(slices.Clone(index), i)
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[netip.Addr]() {
				walk(name+".", f.Type, idx)
				continue
			}
			leaves++
			want, ok := part[name]
			if !ok {
				t.Errorf("Spec field %s is in no part of the key", name)
				continue
			}
			s := base
			setNonDefault(t, name, reflect.ValueOf(&s).Elem().FieldByIndex(idx))
			if key(base) == key(s) {
				t.Errorf("setting %s does not change the check's key", name)
			}
			a, b := id(base), id(s)
			changed := []string{}
			if key(base).target != key(s).target || a.path != b.path {
				changed = append(changed, "target")
			}
			if a.question != b.question {
				changed = append(changed, "question")
			}
			if len(changed) == 0 {
				changed = append(changed, "timing")
			}
			if len(changed) != 1 || changed[0] != want {
				t.Errorf("setting %s changes %v of the check's id, want the %s alone", name, changed, want)
			}
		}
	}
	walk("", reflect.TypeFor[Spec](), nil)
	if leaves != len(part) {
		t.Errorf("Spec has %d fields, the table %d", leaves, len(part))
	}
}

// setNonDefault sets v, a zero field of a Spec, to a value that is not
// its default.
func setNonDefault(t *testing.T, name string, v reflect.Value) {
	t.Helper()
	switch v.Interface().(type) {
	case Kind:
		v.Set(reflect.ValueOf(KindHTTPS))
	case State:
		v.Set(reflect.ValueOf(Up))
	case time.Duration:
		v.Set(reflect.ValueOf(7 * time.Second))
	case netip.Addr:
		v.Set(reflect.ValueOf(netip.MustParseAddr("127.0.0.9")))
	case []StatusRange:
		v.Set(reflect.ValueOf([]StatusRange{{Lo: 204, Hi: 204}}))
	case map[string]string:
		v.Set(reflect.ValueOf(map[string]string{"X-Check": "1"}))
	case []string:
		v.Set(reflect.ValueOf([]string{"x"}))
	case []byte:
		v.Set(reflect.ValueOf([]byte("x")))
	case *User:
		v.Set(reflect.ValueOf(&User{Name: "x", UID: 7, GID: 7}))
	case *CABundle:
		v.Set(reflect.ValueOf(&CABundle{File: "x", Sum: [32]byte{7}}))
	case string:
		v.SetString("X")
	case bool:
		v.SetBool(true)
	case int:
		v.SetInt(7)
	case uint16, uint32:
		v.SetUint(7)
	case float64:
		v.SetFloat(0.3)
	default:
		t.Fatalf("no value for %s of type %s", name, v.Type())
	}
}
