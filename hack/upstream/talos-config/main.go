// Command talos-config loads and validates a Talos machine config with
// Talos's own machinery (github.com/siderolabs/talos/pkg/machinery), as a
// Talos node does when it is handed the config, so the harness can refuse a
// worker config exactly where Talos would.
//
//	talos-config validate --mode cloud|metal|container [--strict] < config.yaml
//	talos-config --version
//
// validate exits 0 when Talos accepts the config (its warnings on stderr),
// 1 with Talos's message on stderr when the loader or the validator refuses
// it, and 2 on a usage error.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
)

const machinery = "github.com/siderolabs/talos/pkg/machinery"

// mode is a Talos runtime mode. Talos's own type lives in its machined
// (not in machinery); validation only asks these two questions of it.
type mode struct {
	name           string
	requireInstall bool
	inContainer    bool
}

func (m mode) String() string        { return m.name }
func (m mode) RequiresInstall() bool { return m.requireInstall }
func (m mode) InContainer() bool     { return m.inContainer }

var modes = map[string]mode{
	// Cloud platforms (openstack, nocloud images booted from a prepared disk)
	// run Talos from the disk image: no install step.
	"cloud": {name: "cloud"},
	// Metal installs Talos to the disk named in machine.install first.
	"metal":     {name: "metal", requireInstall: true},
	"container": {name: "container", inContainer: true},
}

func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == machinery {
			return dep.Version
		}
	}
	return "unknown"
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Printf("talos-config (Talos machinery %s)\n", version())
		return
	}
	if len(os.Args) < 2 || os.Args[1] != "validate" {
		fmt.Fprintln(os.Stderr, "usage: talos-config validate --mode cloud|metal|container [--strict] < config.yaml")
		os.Exit(2)
	}
	flags := flag.NewFlagSet("validate", flag.ContinueOnError)
	modeName := flags.String("mode", "cloud", "the runtime mode the node runs in: cloud, metal or container")
	strict := flags.Bool("strict", false, "treat warnings as errors")
	if err := flags.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	runtimeMode, ok := modes[*modeName]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown mode %q\n", *modeName)
		os.Exit(2)
	}
	if err := validate(os.Stdin, runtimeMode, *strict); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func validate(input io.Reader, runtimeMode mode, strict bool) error {
	source, err := io.ReadAll(input)
	if err != nil {
		return fmt.Errorf("read the config: %w", err)
	}
	config, err := configloader.NewFromBytes(source)
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	var options []validation.Option
	if strict {
		options = append(options, validation.WithStrict())
	}
	warnings, err := config.Validate(runtimeMode, options...)
	for _, warning := range warnings {
		fmt.Fprintf(os.Stderr, "warning: %s\n", warning)
	}
	if err != nil {
		return fmt.Errorf("validate (%s mode): %w", runtimeMode, err)
	}
	if config.Machine() == nil {
		return errors.New("validate: the config has no machine section")
	}
	return nil
}
