package config

// The block parser decodes a [[service]] block into the decoder's generic
// values (tables as map[string]any) and converts those here, which is a
// quarter of the decoding time cheaper than letting the decoder fill
// rawService by reflection and then asking it for undecoded keys. The
// conversion is strict: it knows the keys by their exact names and each
// value by the one type the decoder would accept for its field, and it
// gives up on anything else (a key spelt in another case, a value of
// another type, an unknown key), after which the block is decoded into
// rawService by the decoder itself, as the whole file would be.

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
	tables, ok := m["service"].([]map[string]any)
	if !ok || len(tables) != 1 {
		c.fail()
		return nil
	}
	r := &rawService{}
	for k, v := range tables[0] {
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
			r.Persistence = &duration{raw: v}
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
// tables.
func (c *converter) backends(v any) []rawBackend {
	switch list := v.(type) {
	case []any:
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
	case []map[string]any:
		out := make([]rawBackend, len(list))
		for i, m := range list {
			c.backend(m, &out[i])
		}
		return out
	}
	c.fail()
	return nil
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
			r.Interval = &duration{raw: v}
		case "timeout":
			r.Timeout = &duration{raw: v}
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
