package config

// Memc configures the endpoints compatible with nginx + HttpMemcModule
// (memc-nginx-module); see docs/migrating-from-nginx-memc.md.
type Memc struct {
	Path string `env:"PATH" envDefault:"/memc" help:"query-style endpoint (?cmd=&key=&val=&flags=&exptime=) like HttpMemcModule's; empty turns it off (the path is then an ordinary key)"`
}

// validate checks the Memc settings; each error names its variable.
func (m Memc) validate() []error { return nil }
