package config

import (
	"bytes"

	gotoml "github.com/pelletier/go-toml/v2"
)

// Two TOML libraries: the block parser decodes each block (the preamble,
// each [[service]]) with github.com/pelletier/go-toml/v2 into generic
// values (tables as map[string]any, arrays as []any, integers int64,
// floats float64) and converts those here. go-toml decodes a valid file
// about eight times faster than github.com/BurntSushi/toml, with a tenth
// of the memory; BurntSushi's lexer passes every token through a channel.
// BurntSushi stays the reference: the whole-file parse (parseWhole) that
// reports every error with its line is unchanged, and so is every error
// message. Whatever go-toml rejects, or decodes into anything the
// conversion does not know, is decoded again by BurntSushi, block by block
// (decodeBlock, decodePreamble) and, failing that, as the whole file.
//
// The conversion is strict: it knows the keys by their exact names and
// each value by the one type BurntSushi would accept for its field, and it
// gives up on anything else (a key spelt in another case, which BurntSushi
// matches to a field, a value of another type, an unknown key, a date).
// What the two libraries accept differs at the edges: BurntSushi v1.6.0
// accepts some invalid TOML that go-toml rejects (a table header for a
// table already defined by dotted keys, a key that extends an inline
// table, a byte order mark), which then takes the BurntSushi path, as it
// did before go-toml. The other way round, go-toml accepting what
// BurntSushi rejects or decoding a value differently, would make the block
// parser diverge from the whole file: TestDecoders and FuzzDecoders look
// for it, and have found none.

// decodeFast decodes one block with go-toml into generic values. It
// declines a block with too many keys (see tooManyKeys).
func decodeFast(data []byte) (map[string]any, bool) {
	if tooManyKeys(data) {
		return nil, false
	}
	var m map[string]any
	if err := gotoml.Unmarshal(data, &m); err != nil {
		return nil, false
	}
	return m, true
}

// tooManyKeys reports whether a block may hold more than blockMaxKeys
// keys, tables and arrays, counting each "=", "[" and "{". go-toml finds
// each key among those seen before in its block by a linear search, which
// makes a block of n keys cost n² (400 KB of short keys took 3.5 s); and
// BurntSushi, the other decoder, is linear but costs so much memory per key
// that decoding such a block and then, when it fails, the whole file,
// would cost twice that. The block parser leaves such a block to the
// whole-file parse, which decodes it once, with BurntSushi.
func tooManyKeys(data []byte) bool {
	return bytes.Count(data, []byte("="))+bytes.Count(data, []byte("["))+bytes.Count(data, []byte("{")) > blockMaxKeys
}

// blockMaxKeys bounds what tooManyKeys lets through: a service with 300
// backends written as inline tables counts about 900 (an "=" for each key,
// a "{" for each backend).
const blockMaxKeys = 1024

// preamble converts the decoding of the text before the first
// [[service]]: nothing, include patterns, a [daemon] table.
func (c *converter) preamble(m map[string]any) *rawConfig {
	raw := &rawConfig{}
	r := &raw.Daemon
	for k, v := range m {
		if k == "include" {
			raw.Include = c.strs(v)
			if !c.ok {
				return nil
			}
			continue
		}
		if k != "daemon" {
			c.fail()
			return nil
		}
		t, ok := v.(map[string]any)
		if !ok {
			c.fail()
			return nil
		}
		for k, v := range t {
			switch k {
			case "interface":
				r.Interface = c.strp(v)
			case "uplinks":
				r.Uplinks = c.strs(v)
			case "strict_arp":
				r.StrictARP = c.boolp(v)
			case "manage_sysctls":
				r.ManageSysctls = c.boolp(v)
			case "manage_iptables":
				r.ManageIPTables = c.boolp(v)
			case "filter_vip_ports":
				r.FilterVIPPorts = c.boolp(v)
			case "snat_mark":
				r.SNATMark = c.intp(v)
			case "metrics_listen":
				r.MetricsListen = c.strp(v)
			case "control_socket":
				r.ControlSocket = c.strp(v)
			case "state_dir":
				r.StateDir = c.strp(v)
			case "on_stop":
				r.OnStop = c.strp(v)
			case "resync_interval":
				r.ResyncInterval = c.duration(v)
			case "stats_interval":
				r.StatsInterval = c.duration(v)
			case "drain":
				r.Drain = c.boolp(v)
			case "drain_services":
				r.DrainServices = c.boolp(v)
			case "drain_timeout":
				r.DrainTimeout = c.duration(v)
			case "drain_grace":
				r.DrainGrace = c.duration(v)
			case "garp_count":
				r.GARPCount = c.intp(v)
			case "garp_interval":
				r.GARPInterval = c.duration(v)
			case "garp_refresh":
				r.GARPRefresh = c.duration(v)
			case "watch":
				r.Watch = c.boolp(v)
			case "reload_guard":
				// BurntSushi also takes an integer for a float; leave
				// that to it.
				g, ok := v.(float64)
				if !ok {
					c.fail()
				}
				r.ReloadGuard = &g
			case "on_apply_error":
				r.OnApplyError = c.strp(v)
			case "check_user":
				r.CheckUser = c.strp(v)
			default:
				c.fail()
			}
			if !c.ok {
				return nil
			}
		}
	}
	return raw
}

// converter converts decoded values; ok turns false at the first value it
// does not handle.
type converter struct{ ok bool }

func (c *converter) fail() { c.ok = false }

// serviceBlock converts the decoding of one [[service]] block.
func (c *converter) serviceBlock(m map[string]any) *rawService {
	if len(m) != 1 {
		c.fail()
		return nil
	}
	tables, ok := m["service"].([]any)
	if !ok || len(tables) != 1 {
		c.fail()
		return nil
	}
	t, ok := tables[0].(map[string]any)
	if !ok {
		c.fail()
		return nil
	}
	r := &rawService{}
	for k, v := range t {
		switch k {
		case "name":
			r.Name = c.str(v)
		case "vip":
			r.VIP = c.str(v)
		case "port":
			r.Port = c.intp(v)
		case "protocol":
			r.Protocol = c.str(v)
		case "fwmark":
			r.FWMark = c.int(v)
		case "family":
			r.Family = c.str(v)
		case "nodeport":
			r.NodePort = c.bool(v)
		case "interfaces":
			r.Interfaces = c.strs(v)
		case "scheduler":
			r.Scheduler = c.str(v)
		case "scheduler_flags":
			r.SchedulerFlags = c.strs(v)
		case "forward":
			r.Forward = c.str(v)
		case "tunnel":
			r.Tunnel = c.str(v)
		case "tunnel_port":
			r.TunnelPort = c.int(v)
		case "tunnel_checksum":
			r.TunnelChecksum = c.str(v)
		case "persistence":
			r.Persistence = c.duration(v)
		case "persistence_netmask":
			r.PersistenceNetmask = c.intp(v)
		case "one_packet":
			r.OnePacket = c.bool(v)
		case "snat":
			r.SNAT = c.boolp(v)
		case "announce":
			r.Announce = c.boolp(v)
		case "check":
			r.Check = c.check(v)
		case "on_failure":
			r.OnFailure = c.str(v)
		case "quorum":
			r.Quorum = c.int(v)
		case "quorum_hysteresis":
			r.QuorumHysteresis = c.int(v)
		case "sorry":
			r.Sorry = c.str(v)
		case "backend":
			r.Backend = c.backends(v)
		default:
			c.fail()
		}
		if !c.ok {
			return nil
		}
	}
	return r
}

// backends converts an inline array of inline tables or an array of
// tables (go-toml decodes both into []any).
func (c *converter) backends(v any) []rawBackend {
	list, ok := v.([]any)
	if !ok {
		c.fail()
		return nil
	}
	out := make([]rawBackend, len(list))
	for i, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			c.fail()
			return nil
		}
		c.backend(m, &out[i])
	}
	return out
}

func (c *converter) backend(m map[string]any, r *rawBackend) {
	for k, v := range m {
		switch k {
		case "address":
			r.Address = c.str(v)
		case "port":
			r.Port = c.intp(v)
		case "weight":
			r.Weight = c.intp(v)
		case "upper_threshold":
			r.UpperThreshold = c.int(v)
		case "lower_threshold":
			r.LowerThreshold = c.int(v)
		case "forward":
			r.Forward = c.str(v)
		case "tunnel":
			r.Tunnel = c.str(v)
		case "tunnel_port":
			r.TunnelPort = c.int(v)
		case "tunnel_checksum":
			r.TunnelChecksum = c.str(v)
		case "check":
			r.Check = c.check(v)
		default:
			c.fail()
		}
	}
}

func (c *converter) check(v any) *rawCheck {
	m, ok := v.(map[string]any)
	if !ok {
		c.fail()
		return nil
	}
	r := &rawCheck{}
	for k, v := range m {
		switch k {
		case "type":
			r.Type = c.str(v)
		case "interval":
			r.Interval = c.duration(v)
		case "timeout":
			r.Timeout = c.duration(v)
		case "rise":
			r.Rise = c.int(v)
		case "fall":
			r.Fall = c.int(v)
		case "initial":
			r.Initial = c.str(v)
		case "jitter":
			switch x := v.(type) {
			case int64:
				n := number(x)
				r.Jitter = &n
			case float64:
				n := number(x)
				r.Jitter = &n
			default:
				c.fail()
			}
		case "address":
			r.Address = c.str(v)
		case "port":
			r.Port = c.int(v)
		case "mark":
			r.Mark = c.int(v)
		case "device":
			r.Device = c.str(v)
		case "source":
			r.Source = c.str(v)
		case "method":
			r.Method = c.str(v)
		case "path":
			r.Path = c.str(v)
		case "host":
			r.Host = c.str(v)
		case "sni":
			r.SNI = c.str(v)
		case "status":
			r.Status = c.str(v)
		case "body":
			r.Body = c.str(v)
		case "body_regexp":
			r.BodyRegexp = c.str(v)
		case "insecure":
			r.Insecure = c.bool(v)
		case "ca_file":
			r.CAFile = c.str(v)
		case "headers":
			r.Headers = c.strMap(v)
		case "payload":
			r.Payload = c.str(v)
		case "expect":
			r.Expect = c.str(v)
		case "name":
			r.Name = c.str(v)
		case "record":
			r.Record = c.str(v)
		case "tcp":
			r.TCP = c.bool(v)
		case "expect_answer":
			r.ExpectAnswer = c.bool(v)
		case "no_recursion":
			r.NoRecursion = c.bool(v)
		case "command":
			r.Command = c.str(v)
		case "args":
			r.Args = c.strs(v)
		case "env":
			r.Env = c.strs(v)
		default:
			c.fail()
		}
	}
	return r
}

func (c *converter) str(v any) string {
	s, ok := v.(string)
	if !ok {
		c.fail()
	}
	return s
}

func (c *converter) int(v any) int64 {
	n, ok := v.(int64)
	if !ok {
		c.fail()
	}
	return n
}

func (c *converter) intp(v any) *int64 {
	n := c.int(v)
	return &n
}

func (c *converter) strp(v any) *string {
	s := c.str(v)
	return &s
}

// duration keeps a duration's value for the validator, which takes an
// integer or a string; anything else (a float, a date) it reports as an
// error, with the value's BurntSushi type, so leave it to BurntSushi.
func (c *converter) duration(v any) *duration {
	switch v.(type) {
	case int64, string:
	default:
		c.fail()
	}
	return &duration{raw: v}
}

func (c *converter) bool(v any) bool {
	b, ok := v.(bool)
	if !ok {
		c.fail()
	}
	return b
}

func (c *converter) boolp(v any) *bool {
	b := c.bool(v)
	return &b
}

// strs converts an array of strings. An empty array is an empty, not a
// nil, slice, as the decoder makes it.
func (c *converter) strs(v any) []string {
	list, ok := v.([]any)
	if !ok {
		c.fail()
		return nil
	}
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = c.str(e)
	}
	return out
}

// strMap converts a table of strings. An empty table is an empty, not a
// nil, map, as the decoder makes it.
func (c *converter) strMap(v any) map[string]string {
	m, ok := v.(map[string]any)
	if !ok {
		c.fail()
		return nil
	}
	out := make(map[string]string, len(m))
	for k, e := range m {
		out[k] = c.str(e)
	}
	return out
}
