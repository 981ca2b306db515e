package check

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

// DNSOptions configure dns checks.
type DNSOptions struct {
	// Name is the name queried; empty means the root, ".".
	Name string
	// Type is the record type queried, such as "A" or "AAAA"; empty
	// means "SOA".
	Type string
	// TCP queries over TCP instead of UDP.
	TCP bool
	// ExpectAnswer requires at least one record of Type in the answer;
	// otherwise any NOERROR reply passes.
	ExpectAnswer bool
	// NoRecursion clears the recursion-desired bit, for authoritative
	// servers that refuse recursive queries.
	NoRecursion bool
}

var dnsTypes = map[string]dnsmessage.Type{
	"A":     dnsmessage.TypeA,
	"AAAA":  dnsmessage.TypeAAAA,
	"CNAME": dnsmessage.TypeCNAME,
	"MX":    dnsmessage.TypeMX,
	"NS":    dnsmessage.TypeNS,
	"PTR":   dnsmessage.TypePTR,
	"SOA":   dnsmessage.TypeSOA,
	"SRV":   dnsmessage.TypeSRV,
	"TXT":   dnsmessage.TypeTXT,
}

// WithDefaults returns o with its zero fields set to their defaults.
func (o DNSOptions) WithDefaults() DNSOptions {
	if o.Name == "" {
		o.Name = "."
	}
	if o.Type == "" {
		o.Type = "SOA"
	}
	o.Type = strings.ToUpper(o.Type)
	return o
}

// Validate reports every problem of o (after defaults) at once.
func (o DNSOptions) Validate() error {
	var errs []error
	if _, ok := dnsTypes[o.Type]; !ok {
		errs = append(errs, fmt.Errorf("dns type %q is not one of A, AAAA, CNAME, MX, NS, PTR, SOA, SRV, TXT", o.Type))
	}
	// Packing a query checks the name's label lengths too.
	if name, err := dnsmessage.NewName(FQDN(o.Name)); err != nil {
		errs = append(errs, fmt.Errorf("dns name %q: %w", o.Name, err))
	} else if _, err := (&dnsmessage.Message{Questions: []dnsmessage.Question{{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}).Pack(); err != nil {
		errs = append(errs, fmt.Errorf("dns name %q: %w", o.Name, err))
	}
	return errors.Join(errs...)
}

// FQDN returns name with the trailing dot of a fully qualified name.
func FQDN(name string) string {
	if strings.HasSuffix(name, ".") {
		return name
	}
	return name + "."
}

// DNSType returns the record type a dns check's Type names (after
// defaults), and whether it is one a check may query.
func DNSType(name string) (dnsmessage.Type, bool) {
	t, ok := dnsTypes[name]
	return t, ok
}
