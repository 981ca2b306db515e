package health

import (
	"golang.org/x/net/dns/dnsmessage"

	checkdesc "github.com/vipd/vipd/monitor/check"
)

// The description of a check lives in monitor/check, which the config
// package imports without this package's probing. These names keep the
// checker's code and its callers reading as before.
type (
	Kind        = checkdesc.Kind
	State       = checkdesc.State
	Spec        = checkdesc.Spec
	Target      = checkdesc.Target
	DialOptions = checkdesc.DialOptions
	TCPOptions  = checkdesc.TCPOptions
	HTTPOptions = checkdesc.HTTPOptions
	StatusRange = checkdesc.StatusRange
	UDPOptions  = checkdesc.UDPOptions
	DNSOptions  = checkdesc.DNSOptions
	ExecOptions = checkdesc.ExecOptions
	User        = checkdesc.User
	CABundle    = checkdesc.CABundle
	Action      = checkdesc.Action
	Policy      = checkdesc.Policy
)

// The kinds, states and actions (see monitor/check).
const (
	KindTCP   = checkdesc.KindTCP
	KindHTTP  = checkdesc.KindHTTP
	KindHTTPS = checkdesc.KindHTTPS
	KindUDP   = checkdesc.KindUDP
	KindDNS   = checkdesc.KindDNS
	KindExec  = checkdesc.KindExec
	Down      = checkdesc.Down
	Up        = checkdesc.Up
	Quiesce   = checkdesc.Quiesce
	Remove    = checkdesc.Remove
)

// ExecPath is the PATH of every exec check's command (see checkdesc.ExecPath).
const ExecPath = checkdesc.ExecPath

// Defaults and bounds of a Spec (see monitor/check).
const (
	DefaultInterval = checkdesc.DefaultInterval
	DefaultTimeout  = checkdesc.DefaultTimeout
	DefaultRise     = checkdesc.DefaultRise
	DefaultFall     = checkdesc.DefaultFall
	DefaultJitter   = checkdesc.DefaultJitter
	MaxJitter       = checkdesc.MaxJitter
	MinInterval     = checkdesc.MinInterval
)

func validMethod(s string) bool { return checkdesc.ValidToken(s) }

func fqdn(name string) string { return checkdesc.FQDN(name) }

func dnsType(name string) (dnsmessage.Type, bool) { return checkdesc.DNSType(name) }
