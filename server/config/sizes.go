package config

import (
	"fmt"
	"sort"

	"sandboxd/server/credits"
)

// Size is one named sandbox size (configs/sizes.yaml).
type Size struct {
	Name           string        `yaml:"name"`
	VCPUs          int           `yaml:"vcpus"`
	MemoryMiB      int           `yaml:"memoryMiB"`
	DiskMiB        int           `yaml:"diskMiB"`
	Pids           int           `yaml:"pids"`
	CreditsPerHour credits.Milli `yaml:"creditsPerHour"` // milli-credits per hour of running time
	EgressMiB      int64         `yaml:"egressMiB"`      // egress quota, both directions
}

// EgressBytes is the size's egress quota in bytes.
func (z Size) EgressBytes() int64 { return z.EgressMiB << 20 }

// Sizes is the size table with its default and legacy aliases.
type Sizes struct {
	Default string            `yaml:"default"`
	List    []Size            `yaml:"sizes"`
	Legacy  map[string]string `yaml:"legacy"`
}

// maxEgressMiB keeps EgressBytes far from overflowing.
const maxEgressMiB = 1 << 40

// ParseSizes decodes and checks a size table (configs/sizes.yaml's format;
// unknown keys are errors).
func ParseSizes(b []byte) (Sizes, error) {
	var s Sizes
	if err := decodeStrict(b, &s); err != nil {
		return s, err
	}
	if len(s.List) == 0 {
		return s, fmt.Errorf("no sizes defined (want a sizes: list)")
	}
	seen := map[string]bool{}
	for _, z := range s.List {
		if z.Name == "" || seen[z.Name] {
			return s, fmt.Errorf("size %q: empty or repeated name", z.Name)
		}
		seen[z.Name] = true
		if z.VCPUs < 1 || z.MemoryMiB < 256 || z.DiskMiB < 256 || z.Pids < 128 ||
			z.CreditsPerHour < 0 || z.CreditsPerHour > credits.MaxRate || z.EgressMiB < 0 || z.EgressMiB > maxEgressMiB {
			return s, fmt.Errorf("size %q: limits out of range (vcpus >= 1, memoryMiB >= 256, diskMiB >= 256, pids >= 128, 0 <= creditsPerHour <= 1000000, 0 <= egressMiB <= %d)", z.Name, int64(maxEgressMiB))
		}
	}
	if s.Default == "" {
		return s, fmt.Errorf("default: required (the size of a request that names none)")
	}
	if !seen[s.Default] {
		return s, fmt.Errorf("default size %q is not defined", s.Default)
	}
	for old, cur := range s.Legacy {
		if !seen[cur] {
			return s, fmt.Errorf("legacy size %q maps to unknown size %q", old, cur)
		}
		if seen[old] {
			return s, fmt.Errorf("legacy size %q shadows a current size", old)
		}
	}
	return s, nil
}

// Resolve maps a requested size name ("" for the default, a current name or
// a legacy alias) to its Size. ok is false for anything else.
func (s Sizes) Resolve(requested string) (Size, bool) {
	name := requested
	if name == "" {
		name = s.Default
	}
	if cur, ok := s.Legacy[name]; ok {
		name = cur
	}
	for _, z := range s.List {
		if z.Name == name {
			return z, true
		}
	}
	return Size{}, false
}

// Names lists the accepted names (current, then legacy) for error messages.
func (s Sizes) Names() []string {
	var out []string
	for _, z := range s.List {
		out = append(out, z.Name)
	}
	var legacy []string
	for k := range s.Legacy {
		legacy = append(legacy, k)
	}
	sort.Strings(legacy)
	return append(out, legacy...)
}
