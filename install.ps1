# cc-lhc installer for Windows (x64 and ARM64).
#
#   irm https://github.com/OWNER/REPO/releases/download/cc-lhc-vX.Y.Z/install.ps1 | iex
#   .\install.ps1 -Version 0.1.0 -Quiet
#
# Downloads the cc-lhc bundle for this machine, verifies its SHA-256 with Get-FileHash
# (refusing to install when it differs), unpacks it next to the versions already
# installed, and points the `cc-lhc` command at it with one file replace. cc-lhc's own
# state (~\.cc-lhc) is never touched.
#
# Everything runs inside one script block and failures are thrown and reported there:
# under `irm | iex` an `exit` would close the user's PowerShell window, so none is used.
# Settings for `irm | iex` come from environment variables:
#   CC_LHC_VERSION, CC_LHC_INSTALL_DIR (default %LOCALAPPDATA%\cc-lhc),
#   CC_LHC_BIN_DIR (default <install dir>\bin), CC_LHC_DOWNLOAD_BASE, CC_LHC_REPO.

& {
    param(
        [string]$Version = '',
        [switch]$Quiet,
        [switch]$Help
    )

    # BEGIN CC_LHC_RELEASE (filled in by build/release.py when a release is published)
    $ReleaseVersion = ''
    $ReleaseRepo = ''
    $ReleaseSums = @{}
    # END CC_LHC_RELEASE

    Set-StrictMode -Version 2.0
    $ErrorActionPreference = 'Stop'
    # The progress bar makes Invoke-WebRequest many times slower on Windows PowerShell 5.1.
    $ProgressPreference = 'SilentlyContinue'

    $State = @{ Quiet = [bool]$Quiet; TempDir = $null; Staging = $null; Lock = $null }

    function Write-Step([string]$Message) {
        if (-not $State.Quiet) { Write-Host "cc-lhc install: $Message" }
    }

    function Write-Caution([string]$Message) {
        Write-Warning "cc-lhc install: $Message"
    }

    function Show-Usage {
        Write-Host @"
Install or upgrade cc-lhc.

Usage: install.ps1 [-Version X.Y.Z] [-Quiet] [-Help]
  (with irm | iex, set `$env:CC_LHC_VERSION and friends instead)

Environment:
  CC_LHC_INSTALL_DIR    where versions live (default %LOCALAPPDATA%\cc-lhc)
  CC_LHC_BIN_DIR        where the cc-lhc command is put (default <install dir>\bin)
  CC_LHC_VERSION        same as -Version
  CC_LHC_DOWNLOAD_BASE  URL of the folder holding the release assets (mirrors, tests)
  CC_LHC_REPO           GitHub owner/name to download from

The bundle's SHA-256 must match the release's SHA256SUMS and, in a published
installer, the checksums embedded in this script; otherwise nothing is installed.
Re-running upgrades in place; the version you upgraded from is kept for a rollback,
and running sessions keep their version until they exit.
Uninstall: delete the install folder and remove its bin folder from your user PATH.
"@
    }

    function Get-TargetArch {
        # The registry names the machine's native architecture even when this
        # PowerShell runs under x64 emulation on an ARM64 machine.
        $native = $null
        try {
            $native = (Get-ItemProperty -LiteralPath 'HKLM:\SYSTEM\CurrentControlSet\Control\Session Manager\Environment' -Name PROCESSOR_ARCHITECTURE).PROCESSOR_ARCHITECTURE
        } catch {
            $native = $null
        }
        if (-not $native) { $native = $env:PROCESSOR_ARCHITEW6432 }
        if (-not $native) { $native = $env:PROCESSOR_ARCHITECTURE }
        switch -Regex ([string]$native) {
            '^(AMD64|X64)$' { return 'x64' }
            '^ARM64$' { return 'arm64' }
            default { throw "unsupported CPU architecture '$native' (cc-lhc supports x64 and ARM64)" }
        }
    }

    function Get-Download([string]$Url, [string]$OutFile) {
        try {
            Invoke-WebRequest -Uri $Url -OutFile $OutFile -UseBasicParsing
        } catch {
            throw "could not download ${Url}: $($_.Exception.Message)"
        }
    }

    # A name listed more than once maps to '' (no sum): which of its lines is the real
    # one cannot be told, so it is refused whichever comes first.
    function Read-Sums([string]$Text) {
        $sums = @{}
        foreach ($line in ($Text -split "`r?`n")) {
            if ($line -match '^([0-9a-fA-F]{64}) [ *]?(.+)$') {
                if ($sums.ContainsKey($Matches[2])) {
                    $sums[$Matches[2]] = ''
                } else {
                    $sums[$Matches[2]] = $Matches[1].ToLowerInvariant()
                }
            }
        }
        return $sums
    }

    function Get-Sha256([string]$Path) {
        if (-not (Get-Command Get-FileHash -ErrorAction SilentlyContinue)) {
            throw 'Get-FileHash is not available (PowerShell 4 or newer is needed); refusing to install an unverified download'
        }
        return (Get-FileHash -Algorithm SHA256 -LiteralPath $Path).Hash.ToLowerInvariant()
    }

    # Write $Text to $Path through a temporary file and one replace, so a reader sees
    # either the old or the new content.
    function Set-FileAtomically([string]$Path, [string]$Text) {
        $tmp = "$Path.new"
        # cmd.exe reads batch files in the OEM code page.
        $oem = [System.Text.Encoding]::GetEncoding([System.Globalization.CultureInfo]::CurrentCulture.TextInfo.OEMCodePage)
        [System.IO.File]::WriteAllText($tmp, $Text, $oem)
        if (Test-Path -LiteralPath $Path) {
            [System.IO.File]::Replace($tmp, $Path, [NullString]::Value)
        } else {
            [System.IO.File]::Move($tmp, $Path)
        }
    }

    function Update-UserPath([string]$Dir) {
        $key = Get-Item -LiteralPath 'HKCU:\Environment'
        $raw = [string]$key.GetValue('Path', '', 'DoNotExpandEnvironmentNames')
        $parts = @($raw -split ';' | Where-Object { $_ -ne '' })
        if ($parts -contains $Dir) { return $false }
        $kind = if ($raw -match '%') { 'ExpandString' } else { 'String' }
        Set-ItemProperty -LiteralPath 'HKCU:\Environment' -Name Path -Value ((@($Dir) + $parts) -join ';') -Type $kind
        # Tell Explorer and new terminals that the environment changed.
        try {
            if (-not ('CcLhcInstall.Native' -as [type])) {
                Add-Type -Namespace CcLhcInstall -Name Native -MemberDefinition @'
[DllImport("user32.dll", SetLastError = true, CharSet = CharSet.Auto)]
public static extern IntPtr SendMessageTimeout(IntPtr hWnd, uint Msg, UIntPtr wParam, string lParam, uint fuFlags, uint uTimeout, out UIntPtr lpdwResult);
'@
            }
            $result = [UIntPtr]::Zero
            [void][CcLhcInstall.Native]::SendMessageTimeout([IntPtr]0xffff, 0x1A, [UIntPtr]::Zero, 'Environment', 2, 5000, [ref]$result)
        } catch {
            Write-Caution 'PATH was updated; open a new terminal for it to take effect'
        }
        return $true
    }

    # Remove version folders other than the current and previous ones. A folder that a
    # running cc-lhc uses cannot be renamed on Windows, so a failed rename means "in use".
    function Remove-OldVersions([string]$VersionsDir, [string]$Keep, [string]$Previous, [bool]$PreviousKnown) {
        # Leftovers of interrupted runs (we hold the install lock, so none is live).
        foreach ($dir in @(Get-ChildItem -LiteralPath $VersionsDir -Directory)) {
            if ($dir.Name.StartsWith('.staging-') -or $dir.Name.StartsWith('.prune-')) {
                Remove-Item -LiteralPath $dir.FullName -Recurse -Force -ErrorAction SilentlyContinue
            }
        }
        if (-not $Previous -and -not $PreviousKnown) {
            Write-Step 'keeping the old versions: which one you upgraded from is not recorded here yet'
            return
        }
        foreach ($dir in @(Get-ChildItem -LiteralPath $VersionsDir -Directory)) {
            if ($dir.Name -eq $Keep -or $dir.Name -eq $Previous -or $dir.Name.StartsWith('.')) { continue }
            $doomed = Join-Path $VersionsDir ".prune-$($dir.Name)"
            try {
                Rename-Item -LiteralPath $dir.FullName -NewName ".prune-$($dir.Name)"
            } catch {
                Write-Step "keeping $($dir.Name): a running cc-lhc still uses it"
                continue
            }
            Remove-Item -LiteralPath $doomed -Recurse -Force -ErrorAction SilentlyContinue
            Write-Step "removed old version $($dir.Name)"
        }
    }

    # An absolute, normalized path (relative ones are taken from PowerShell's location).
    function Get-FullPath([string]$Path) {
        return [System.IO.Path]::GetFullPath($ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath($Path))
    }

    # The first link (symbolic link or junction) under $Root whose target lies outside
    # $Root, or '' when there is none. Links inside are each checked on their own.
    function Find-EscapingLink([string]$Root) {
        $rootFull = (Get-FullPath $Root).TrimEnd('\') + '\'
        foreach ($item in @(Get-ChildItem -LiteralPath $Root -Recurse -Force -Attributes ReparsePoint -ErrorAction Stop)) {
            $target = [string](@($item.Target)[0])
            if (-not $target) { return $item.FullName }
            if (-not [System.IO.Path]::IsPathRooted($target)) {
                $target = Join-Path (Split-Path -Parent $item.FullName) $target
            }
            $full = (Get-FullPath $target).TrimEnd('\') + '\'
            if (-not $full.StartsWith($rootFull, [System.StringComparison]::OrdinalIgnoreCase)) { return "$($item.FullName) -> $(@($item.Target)[0])" }
        }
        return ''
    }

    # The program a cc-lhc.cmd shim in this installer's format runs, as a full path; ''
    # when the file is not such a shim.
    function Get-ShimTarget([string]$Shim) {
        try {
            $text = [System.IO.File]::ReadAllText($Shim)
        } catch {
            return ''
        }
        if ($text -match '\A@echo off\r?\n"([^"\r\n]+)" %\*\r?\nexit /b %ERRORLEVEL%\r?\n?\z') {
            $target = $Matches[1]
        } else {
            return ''
        }
        if ($target.StartsWith('%~dp0')) {
            $target = Join-Path (Split-Path -Parent $Shim) $target.Substring(5)
        }
        if ($target.Contains('%')) { return '' }
        try {
            return Get-FullPath $target
        } catch {
            return ''
        }
    }

    # Refuse to replace a cc-lhc.cmd that this installer did not write for the install
    # folder (e.g. npm's, when CC_LHC_BIN_DIR names npm's folder). $InstallDirs: the
    # folder's spellings (as given, resolved).
    function Assert-OwnShim([string]$Shim, [string[]]$InstallDirs) {
        if (-not (Test-Path -LiteralPath $Shim)) { return }
        $target = ''
        if (Test-Path -LiteralPath $Shim -PathType Leaf) { $target = Get-ShimTarget (Get-FullPath $Shim) }
        $root = ''
        foreach ($dir in $InstallDirs) {
            $root = (Get-FullPath $dir).TrimEnd('\') + '\'
            if ($target -and $target.StartsWith($root, [System.StringComparison]::OrdinalIgnoreCase)) { return }
        }
        $what = if ($target) { "runs $target, which is not part of this installation ($root)" } else { 'was not written by this installer' }
        throw "$Shim $what`: another cc-lhc (from npm, pip or another install folder?) seems to be there, and cc-lhc was not installed. Remove it (Remove-Item -LiteralPath '$Shim') to replace it with this one, or set `$env:CC_LHC_BIN_DIR to put this installer's command in another folder"
    }

    function Install-CcLhc {
        if ($env:OS -ne 'Windows_NT') { throw 'on Linux and macOS, use install.sh instead' }
        $want = if ($Version) { $Version } elseif ($env:CC_LHC_VERSION) { $env:CC_LHC_VERSION } else { $ReleaseVersion }
        $want = $want -replace '^cc-lhc-', '' -replace '^v', ''
        if ($want -and $want -notmatch '^[0-9A-Za-z.+-]+$') { throw "not a version: $want" }

        $installDir = if ($env:CC_LHC_INSTALL_DIR) { $env:CC_LHC_INSTALL_DIR } else { Join-Path $env:LOCALAPPDATA 'cc-lhc' }
        $binDir = if ($env:CC_LHC_BIN_DIR) { $env:CC_LHC_BIN_DIR } else { Join-Path $installDir 'bin' }
        $arch = Get-TargetArch
        # Before anything is downloaded or changed.
        Assert-OwnShim (Join-Path $binDir 'cc-lhc.cmd') @($installDir)
        $repo = if ($env:CC_LHC_REPO) { $env:CC_LHC_REPO } else { $ReleaseRepo }
        if ($env:CC_LHC_DOWNLOAD_BASE) {
            $base = $env:CC_LHC_DOWNLOAD_BASE.TrimEnd('/')
        } elseif (-not $want) {
            throw 'which version? Pass -Version X.Y.Z or set $env:CC_LHC_VERSION (this copy of install.ps1 names none)'
        } elseif (-not $repo) {
            throw 'this copy of install.ps1 names no GitHub repository: set $env:CC_LHC_REPO or $env:CC_LHC_DOWNLOAD_BASE'
        } else {
            $base = "https://github.com/$repo/releases/download/cc-lhc-v$want"
        }
        if ($PSVersionTable.PSVersion.Major -lt 6) {
            [Net.ServicePointManager]::SecurityProtocol = [Net.ServicePointManager]::SecurityProtocol -bor [Net.SecurityProtocolType]::Tls12
        }

        $State.TempDir = Join-Path ([System.IO.Path]::GetTempPath()) ("cc-lhc-install-" + [guid]::NewGuid().ToString('N'))
        New-Item -ItemType Directory -Path $State.TempDir | Out-Null

        Write-Step "fetching checksums from $base/"
        $sumsFile = Join-Path $State.TempDir 'SHA256SUMS'
        Get-Download "$base/SHA256SUMS" $sumsFile
        $sums = Read-Sums ([System.IO.File]::ReadAllText($sumsFile))

        if (-not $want) {
            $found = @($sums.Keys | Where-Object { $_ -match "^cc-lhc-(.+)-windows-$arch\.zip$" } | ForEach-Object { $_ -replace "^cc-lhc-(.+)-windows-$arch\.zip$", '$1' })
            if ($found.Count -ne 1) { throw "cannot tell which version $base/ holds; pass -Version X.Y.Z" }
            $want = $found[0]
        }
        $asset = "cc-lhc-$want-windows-$arch.zip"
        if (-not $sums.ContainsKey($asset)) {
            throw "the release's SHA256SUMS lists no $asset (is there a windows-$arch build of $want?)"
        }
        if (-not $sums[$asset]) {
            throw "the release's SHA256SUMS lists $asset more than once; refusing to install (nothing was changed)"
        }
        $wantSum = $sums[$asset]

        # A published installer carries its release's checksums, so a mirror that swaps
        # both the bundle and SHA256SUMS is still caught.
        if ($ReleaseSums.Count -gt 0 -and $want -eq $ReleaseVersion) {
            if (-not $ReleaseSums.ContainsKey($asset)) { throw "this installer's embedded checksums list no $asset" }
            $embedded = ([string]$ReleaseSums[$asset]).ToLowerInvariant()
            if ($embedded -ne $wantSum) {
                throw "the downloaded SHA256SUMS does not match the checksums embedded in this installer for $asset`n  want (embedded) $embedded`n  got  (download) $wantSum`nrefusing to install"
            }
        } elseif ($ReleaseSums.Count -gt 0) {
            Write-Step "this installer embeds checksums for $ReleaseVersion only; verifying $want against its release's SHA256SUMS"
        }

        Write-Step "downloading $asset"
        $zip = Join-Path $State.TempDir $asset
        Get-Download "$base/$asset" $zip
        $got = Get-Sha256 $zip
        if ($got -ne $wantSum) {
            throw "checksum mismatch for $asset`n  want $wantSum`n  got  $got`nrefusing to install (nothing was changed)"
        }
        Write-Step "verified sha256 $got"

        $versionsDir = Join-Path $installDir 'versions'
        New-Item -ItemType Directory -Force -Path $versionsDir | Out-Null
        try {
            $State.Lock = [System.IO.File]::Open((Join-Path $installDir '.install-lock'), 'OpenOrCreate', 'ReadWrite', 'None')
        } catch {
            throw 'another cc-lhc install is running; try again when it finishes'
        }

        $name = "$want-" + $got.Substring(0, 12)
        $dest = Join-Path $versionsDir $name
        if ((Test-Path -LiteralPath (Join-Path $dest '.cc-lhc-complete')) -and (Test-Path -LiteralPath (Join-Path $dest 'cc-lhc.exe'))) {
            Write-Step "$want is already unpacked in $dest"
        } else {
            $State.Staging = Join-Path $versionsDir (".staging-" + [guid]::NewGuid().ToString('N'))
            Expand-Archive -LiteralPath $zip -DestinationPath $State.Staging
            $top = Join-Path $State.Staging "cc-lhc-$want-windows-$arch"
            $exe = Join-Path $top 'cc-lhc.exe'
            if (-not (Test-Path -LiteralPath $exe)) { throw "$asset does not contain cc-lhc-$want-windows-$arch\cc-lhc.exe" }
            # Verified is not the same as harmless: a link that leads out of the bundle's
            # own folder would make the installed version use files it does not carry.
            $escape = Find-EscapingLink $top
            if ($escape) { throw "$asset contains a symbolic link that leads outside its own folder ($escape); refusing to install (nothing was changed)" }
            # Try the new build before switching to it, with a throwaway state folder.
            # (Stop would turn the program's stderr lines into exceptions on PowerShell 5.1.)
            $savedHome = $env:CC_LHC_HOME
            $savedPreference = $ErrorActionPreference
            $status = 1
            try {
                $env:CC_LHC_HOME = Join-Path $State.TempDir 'state'
                $ErrorActionPreference = 'Continue'
                $check = & $exe --lhc-version 2>&1 | Out-String
                $status = $LASTEXITCODE
            } catch {
                $check = $_.Exception.Message
            } finally {
                $ErrorActionPreference = $savedPreference
                $env:CC_LHC_HOME = $savedHome
            }
            if ($status -ne 0) { throw "the downloaded cc-lhc does not run on this system; nothing was changed:`n$check" }
            [System.IO.File]::WriteAllText((Join-Path $top '.cc-lhc-complete'), "$got`n")
            if (Test-Path -LiteralPath $dest) { Remove-Item -LiteralPath $dest -Recurse -Force }
            Move-Item -LiteralPath $top -Destination $dest
        }

        # The switch: `current` names the version, and the cc-lhc.cmd shim runs it. A
        # running cc-lhc keeps its own folder (Windows would not let us remove it anyway).
        $currentFile = Join-Path $installDir 'current'
        $was = ''
        if (Test-Path -LiteralPath $currentFile) { $was = ([System.IO.File]::ReadAllText($currentFile)).Trim() }
        New-Item -ItemType Directory -Force -Path $binDir | Out-Null
        $binFull = (Resolve-Path -LiteralPath $binDir).ProviderPath
        $installFull = (Resolve-Path -LiteralPath $installDir).ProviderPath
        $shim = Join-Path $binFull 'cc-lhc.cmd'
        Assert-OwnShim $shim @($installDir, $installFull)  # again, before switching: it may have appeared meanwhile

        # `previous` names the version to roll back to. It changes only when the current
        # version does, so re-running the same version keeps it (and never prunes it). It
        # is written before `current`: a run cut short in between never leaves it stale.
        $previousFile = Join-Path $installDir 'previous'
        $hadPrevious = Test-Path -LiteralPath $previousFile
        $previous = ''
        if ($hadPrevious) { $previous = ([System.IO.File]::ReadAllText($previousFile)).Trim() }
        if ($previous -match '[\\/]' -or $previous.StartsWith('.')) { $previous = '' }
        $previousKnown = $true
        if ($was -and $was -ne $name) {
            Set-FileAtomically $previousFile "$was`r`n"
            $previous = $was
        } elseif ($was -and -not $hadPrevious) {
            $previousKnown = $false  # installed by an older installer that did not record it
        }
        if ($previous -eq $name) { $previous = '' }
        if ($binFull.TrimEnd('\') -eq (Join-Path $installFull 'bin')) {
            $target = "%~dp0..\versions\$name\cc-lhc.exe"  # keeps the shim ASCII whatever the profile path
        } else {
            $target = Join-Path $dest 'cc-lhc.exe'
        }
        Set-FileAtomically $shim "@echo off`r`n`"$target`" %*`r`nexit /b %ERRORLEVEL%`r`n"
        Set-FileAtomically $currentFile "$name`r`n"

        Remove-OldVersions $versionsDir $name $previous $previousKnown

        if ($was -and $was -ne $name) {
            Write-Step "upgraded $($was -replace '-[0-9a-f]{12}$', '') -> $want; sessions already running keep their version until they exit"
        }
        if ($previous -and (Test-Path -LiteralPath (Join-Path $versionsDir $previous))) {
            Write-Step "kept $($previous -replace '-[0-9a-f]{12}$', '') for a rollback: $(Join-Path (Join-Path $versionsDir $previous) 'cc-lhc.exe')"
        }
        Write-Step "installed cc-lhc $want in $dest"
        if (Update-UserPath $binFull) {
            $env:Path = "$binFull;$env:Path"
            Write-Step "added $binFull to your user PATH (new terminals pick it up; this one already has it)"
        }
    }

    if ($Help) { Show-Usage; return }
    try {
        Install-CcLhc
    } catch {
        Write-Host "cc-lhc install: error: $($_.Exception.Message)" -ForegroundColor Red
        # Fail a calling script without closing an interactive window (no `exit`).
        $global:LASTEXITCODE = 1
    } finally {
        if ($State.Lock) { $State.Lock.Dispose() }
        foreach ($dir in @($State.Staging, $State.TempDir)) {
            if ($dir -and (Test-Path -LiteralPath $dir)) { Remove-Item -LiteralPath $dir -Recurse -Force -ErrorAction SilentlyContinue }
        }
    }
} @args
