package migrate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vipd/vipd/config"
)

// validPrefix is put before an imported configuration to validate it:
// exec checks run as check_user, which the package creates; a numeric
// user and group stand in for it without a look-up on this host.
const validPrefix = "[daemon]\ncheck_user = \"65534:65534\"\n"

// haPart is the [ha] section of an import and where it was read.
type haPart struct {
	text string
	file string
	line int
}

// settle renders the services and has vipd's own parser, the one "vipd
// check" runs, validate them: a service it refuses is left out and
// reported at the line it was read from, with the parser's reason, and so
// is an [ha] section. The mappers avoid what vipd refuses; this is the
// arbiter for what they miss.
func settle(head string, ha haPart, svcs []*service, issues []Issue) ([]byte, []*service, []Issue) {
	prefix := strings.Count(validPrefix, "\n")
	for {
		full := head
		if ha.text != "" {
			full += "\n" + ha.text
		}
		toml, starts := render(full, svcs)
		_, err := config.Parse("import.toml", append([]byte(validPrefix), toml...))
		if err == nil {
			return toml, svcs, issues
		}
		if len(svcs) == 0 && ha.text == "" {
			// The header alone always parses; never loop.
			return toml, nil, append(issues, Issue{File: "import", What: "configuration", Why: err.Error()})
		}
		var errs config.Errors
		if !errors.As(err, &errs) {
			errs = config.Errors{{Msg: err.Error()}}
		}
		bad := map[int]string{}
		dropHA := false
		for _, e := range errs {
			line := e.Line - prefix
			i := -1
			for j, st := range starts {
				if st <= line {
					i = j
				}
			}
			msg := e.Msg
			if e.Ctx != "" {
				msg = e.Ctx + ": " + e.Msg
			}
			switch {
			case i >= 0:
				if _, seen := bad[i]; !seen {
					bad[i] = msg
				}
			case ha.text != "" && line > 0:
				if !dropHA {
					issues = append(issues, Issue{File: ha.file, Line: ha.line, What: "vrrp_instance", Why: "vipd refuses the [ha] section made from it (" + msg + "): not imported"})
				}
				dropHA = true
			default:
				// Not attributable: nothing can be imported.
				for _, s := range svcs {
					issues = append(issues, Issue{File: s.file, Line: s.line, What: s.key(), Why: "vipd refuses the import (" + msg + "): not imported"})
				}
				svcs = nil
				dropHA = ha.text != ""
			}
		}
		if dropHA {
			ha.text = ""
		}
		kept := svcs[:0]
		for i, s := range svcs {
			if msg, ok := bad[i]; ok {
				issues = append(issues, Issue{File: s.file, Line: s.line, What: s.key(), Why: fmt.Sprintf("vipd refuses the service made from it (%s): not imported", msg)})
				continue
			}
			kept = append(kept, s)
		}
		if len(bad) == 0 && !dropHA && svcs != nil {
			// Nothing was left out, yet the parse failed: give up on all.
			for _, s := range svcs {
				issues = append(issues, Issue{File: s.file, Line: s.line, What: s.key(), Why: "vipd refuses the import (" + err.Error() + "): not imported"})
			}
			kept = nil
		}
		svcs = kept
	}
}
