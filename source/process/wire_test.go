package process

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
	"github.com/vipd/vipd/source"
)

// notOnWire are the fields of check.Spec the wire refuses to carry.
var notOnWire = map[string]bool{"Spec.Exec": true, "HTTPOptions.CA": true, "HTTPOptions.CAFile": true}

// fill sets every exported field under v to a value other than zero,
// failing on what JSON cannot carry (unexported fields, funcs,
// channels, interfaces), so that a field added later to the types the
// wire carries is caught by the round trip.
func fill(t *testing.T, v reflect.Value, path string, n *int) {
	t.Helper()
	*n++
	switch v.Interface().(type) {
	case netip.Addr:
		v.Set(reflect.ValueOf(netip.AddrFrom4([4]byte{192, 0, 2, byte(*n)})))
		return
	case netip.AddrPort:
		v.Set(reflect.ValueOf(netip.AddrPortFrom(netip.MustParseAddr("2001:db8::1"), uint16(*n))))
		return
	case netip.Prefix:
		v.Set(reflect.ValueOf(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(*n), 0, 0}), 16)))
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.String:
		v.SetString(path)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), path, n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(t, v.Index(i), path, n)
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, path+"[key]", n)
		fill(t, e, path+"[]", n)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			name := v.Type().Name() + "." + f.Name
			if notOnWire[name] {
				continue
			}
			if !f.IsExported() {
				t.Fatalf("%s (%s) is not exported: the wire does not carry it", name, path)
			}
			fill(t, v.Field(i), path+"."+f.Name, n)
		}
	default:
		t.Fatalf("%s: the wire cannot carry a %s", path, v.Kind())
	}
}

// roundTrip writes m and reads it back.
func roundTrip(t *testing.T, m *Message) *Message {
	t.Helper()
	var buf bytes.Buffer
	c := NewConn(&buf, &buf, 0)
	if err := c.Write(m); err != nil {
		t.Fatal(err)
	}
	got, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestSnapshotRoundTrip fills every field of the services and health a
// snapshot carries and proves they cross the wire unchanged.
func TestSnapshotRoundTrip(t *testing.T) {
	n := 0
	var vs lb.VirtualService
	fill(t, reflect.ValueOf(&vs).Elem(), "vs", &n)
	var h config.ServiceHealth
	fill(t, reflect.ValueOf(&h).Elem(), "health", &n)
	snap := source.Snapshot{Services: []lb.VirtualService{vs, {Name: "empty"}}, Health: map[string]config.ServiceHealth{"vs": h, "none": {}},
		Changed: []string{"vs"}}
	p, err := PublishOf(7, snap, []PoolCount{{Pool: "p", Family: "ipv4", Total: 8, InUse: 1, Free: 7}}, false)
	if err != nil {
		t.Fatal(err)
	}
	got := roundTrip(t, &Message{Type: TypePublish, Publish: p}).Publish
	if got.Seq != 7 || !reflect.DeepEqual(got.Counts, p.Counts) || !reflect.DeepEqual(got.Changed, snap.Changed) {
		t.Errorf("seq %d, counts %+v, changed %v", got.Seq, got.Counts, got.Changed)
	}
	var services []lb.VirtualService
	for i := range got.Services {
		services = append(services, got.Services[i].virtualService())
	}
	if !reflect.DeepEqual(services, snap.Services) {
		t.Errorf("services:\n got %+v\nwant %+v", services, snap.Services)
	}
	for name, w := range got.Health {
		back := config.ServiceHealth{Policy: w.Policy}
		if w.Checks != nil {
			back.Checks = map[netip.AddrPort]*check.Spec{}
		}
		for a, i := range w.Checks {
			back.Checks[a] = new(w.Specs[i].spec())
		}
		if !reflect.DeepEqual(back, snap.Health[name]) {
			t.Errorf("health %q:\n got %+v\nwant %+v", name, back, snap.Health[name])
		}
	}
	if len(got.Health) != len(snap.Health) {
		t.Errorf("health of %d services, want %d", len(got.Health), len(snap.Health))
	}
}

// TestSnapshotValid: a snapshot such as the Kubernetes source publishes
// (a Node probe) comes back whole through Snapshot; a check that does
// not validate is refused.
func TestSnapshotValid(t *testing.T) {
	addr := netip.MustParseAddrPort("10.1.0.5:31000")
	spec := check.Spec{Kind: check.KindHTTP, Port: 10256, Interval: 5 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3,
		Initial: check.Up, HTTP: check.HTTPOptions{Path: "/healthz", Status: []check.StatusRange{{Lo: 200, Hi: 200}}}}
	snap := source.Snapshot{
		Services: []lb.VirtualService{{Name: "k8s/default/web/80/tcp", VIP: netip.MustParseAddr("192.0.2.200"), Announce: true,
			Service:  lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("192.0.2.200"), Port: 80}, Scheduler: "wrr"},
			Allow:    []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
			Backends: []lb.Destination{{Addr: addr, Weight: 1, Forward: lb.Masq}}}},
		Health: map[string]config.ServiceHealth{"k8s/default/web/80/tcp": {Policy: check.Policy{Action: check.Remove, Quorum: 1},
			Checks: map[netip.AddrPort]*check.Spec{addr: &spec}}},
	}
	p, err := PublishOf(1, snap, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	got, err := roundTrip(t, &Message{Type: TypePublish, Publish: p}).Publish.Snapshot(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, snap) {
		t.Errorf("got %+v\nwant %+v", got, snap)
	}
	p.Health["k8s/default/web/80/tcp"].Specs[0].Kind = 99
	if _, err := p.Snapshot(nil, nil); err == nil || !strings.Contains(err.Error(), "check type is missing or unknown") {
		t.Errorf("a check of kind 99: %v", err)
	}
}

// TestRefusedChecks: exec checks and CAs do not cross the wire.
func TestRefusedChecks(t *testing.T) {
	for name, spec := range map[string]check.Spec{
		"exec":   {Kind: check.KindExec, Exec: check.ExecOptions{Command: "/bin/true"}},
		"cafile": {Kind: check.KindHTTPS, HTTP: check.HTTPOptions{CAFile: "/etc/shadow"}},
	} {
		snap := source.Snapshot{Health: map[string]config.ServiceHealth{"s": {Checks: map[netip.AddrPort]*check.Spec{netip.MustParseAddrPort("10.0.0.1:80"): &spec}}}}
		if _, err := PublishOf(1, snap, nil, false); err == nil || !strings.Contains(err.Error(), "do not cross the wire") && !strings.Contains(err.Error(), "does not cross the wire") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// rawFrame returns data as a frame.
func rawFrame(data string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(data))), data...)
}

// TestConnRefuses: a frame over the bound (before it is read), bad JSON,
// unknown fields and types, a message without its body, trailing data,
// and a frame cut short.
func TestConnRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []byte
		want string
	}{
		{"too big", binary.BigEndian.AppendUint32(nil, 1025), "a frame of 1025 bytes: frame too big (the bound is 1024)"},
		{"garbage", rawFrame("{nonsense"), "decode a frame"},
		{"not json", rawFrame("\x00\x01\x02"), "decode a frame"},
		{"unknown type", rawFrame(`{"type":"bogus"}`), `unknown message type "bogus"`},
		{"unknown field", rawFrame(`{"type":"report","report":{},"extra":1}`), `unknown field "extra"`},
		{"no body", rawFrame(`{"type":"publish"}`), "a publish message without its body"},
		{"trailing", rawFrame(`{"type":"report","report":{}} {}`), "data after the message"},
		{"cut short", rawFrame(`{"type":"report","report":{}}`)[:10], "unexpected EOF"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := NewConn(bytes.NewReader(tt.in), nil, 1024)
			m, err := c.Read()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Read = %+v, %v; want an error with %q", m, err, tt.want)
			}
			if tt.name == "too big" && !errors.Is(err, ErrFrameTooBig) {
				t.Errorf("%v is not ErrFrameTooBig", err)
			}
		})
	}
	var buf bytes.Buffer
	err := NewConn(nil, &buf, 64).Write(&Message{Type: TypeReport, Report: &Result{Error: strings.Repeat("x", 64)}})
	if !errors.Is(err, ErrFrameTooBig) || buf.Len() != 0 {
		t.Errorf("Write of a big frame = %v, wrote %d bytes", err, buf.Len())
	}
	if m, err := NewConn(bytes.NewReader(rawFrame(`{"type":"report","report":{"error":"x"}}`)), nil, 0).Read(); err != nil || m.Report.err().Error() != "x" {
		t.Errorf("a good frame: %+v, %v", m, err)
	}
}

// TestHello refuses another version, another schema, and another first
// message.
func TestHello(t *testing.T) {
	if err := checkHello(hello()); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		m    *Message
		want string
	}{
		{&Message{Type: TypeHello, Hello: &Hello{Version: Version + 1, Schema: Schema()}}, "wire version 2, want 1"},
		{&Message{Type: TypeHello, Hello: &Hello{Version: Version, Schema: "0"}}, "wire schema 0"},
		{&Message{Type: TypeReport, Report: &Result{}}, `the first message is "report"`},
	} {
		if err := checkHello(tt.m); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("checkHello(%+v) = %v, want %q", tt.m, err, tt.want)
		}
	}
}

// TestSpecEqual: equal compares every field of Spec: a change of any
// one makes two specs differ.
func TestSpecEqual(t *testing.T) {
	n := 0
	var full Spec
	fill(t, reflect.ValueOf(&full).Elem(), "spec", &n)
	if !full.equal(full) || !(Spec{}).equal(Spec{}) {
		t.Fatal("a spec differs from itself")
	}
	var leaves func(v reflect.Value, path string, f func(reflect.Value, string))
	leaves = func(v reflect.Value, path string, f func(reflect.Value, string)) {
		if v.Kind() == reflect.Struct && v.Type().PkgPath() != "net/netip" {
			for i := range v.NumField() {
				leaves(v.Field(i), path+"."+v.Type().Field(i).Name, f)
			}
			return
		}
		f(v, path)
	}
	count := 0
	leaves(reflect.ValueOf(&full).Elem(), "spec", func(_ reflect.Value, path string) {
		count++
		var one Spec
		fill(t, reflect.ValueOf(&one).Elem(), "spec", new(int))
		// one is full but at path, which is zero there.
		var zero Spec
		src := reflect.ValueOf(&zero).Elem()
		dst := reflect.ValueOf(&one).Elem()
		setAt(dst, src, strings.Split(path, ".")[1:])
		if one.equal(full) || full.equal(one) {
			t.Errorf("specs that differ in %s are equal", path)
		}
	})
	if count < 20 {
		t.Errorf("%d fields walked", count)
	}
}

// setAt sets the field of dst at path to src's.
func setAt(dst, src reflect.Value, path []string) {
	for _, name := range path {
		dst, src = dst.FieldByName(name), src.FieldByName(name)
	}
	dst.Set(src)
}

// TestDelta: a delta rebuilds, from the snapshot taken before, the
// snapshot the child published; a delta without a base, of a service
// the base does not have, out of the order of Changed, or with health
// of a service it does not change, is refused.
func TestDelta(t *testing.T) {
	full := bigSnapshot(3, 2)
	p, err := PublishOf(1, full, nil, true) // no Changed: whole
	if err != nil || p.Delta {
		t.Fatalf("a publish without Changed: delta %v, %v", p.Delta, err)
	}
	base, err := roundTrip(t, &Message{Type: TypePublish, Publish: p}).Publish.Snapshot(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	index := map[string]int{}
	for i, vs := range base.Services {
		index[vs.Name] = i
	}
	next := full
	next.Services = slices.Clone(full.Services)
	next.Services[1].Backends = next.Services[1].Backends[:1]
	next.Changed = []string{next.Services[1].Name}
	d, err := PublishOf(2, next, nil, true)
	if err != nil || !d.Delta || len(d.Services) != 1 || len(d.Health) != 1 {
		t.Fatalf("delta %+v, %v", d, err)
	}
	got, err := roundTrip(t, &Message{Type: TypePublish, Publish: d}).Publish.Snapshot(&base, index)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, next) {
		t.Errorf("the delta's snapshot:\n got %+v\nwant %+v", got, next)
	}
	for _, tt := range []struct {
		name   string
		change func(p *Publish)
		base   *source.Snapshot
		want   string
	}{
		{"no base", func(*Publish) {}, nil, "a delta without a snapshot taken before"},
		{"unknown", func(p *Publish) { p.Services[0].Name, p.Changed[0] = "k8s/x", "k8s/x"; p.Health = nil }, &base, `service "k8s/x" is not a service of the snapshot before`},
		{"order", func(p *Publish) { p.Changed[0] = full.Services[0].Name }, &base, "not a service of the snapshot before, or not its change 0"},
		{"count", func(p *Publish) { p.Changed = append(p.Changed, full.Services[0].Name) }, &base, "a delta of 1 services names 2"},
		{"health", func(p *Publish) { p.Health[full.Services[2].Name] = p.Health[full.Services[1].Name] }, &base, "which it does not change"},
	} {
		d, _ := PublishOf(2, next, nil, true)
		d.Changed = slices.Clone(d.Changed)
		tt.change(d)
		if _, err := d.Snapshot(tt.base, index); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}
