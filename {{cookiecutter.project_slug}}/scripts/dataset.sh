#!/usr/bin/env bash
# Download and unpack LJSpeech-1.1, then write NVIDIA-style train/validation filelists.
#
# Usage: bash scripts/dataset.sh [DATA_DIR]      (DATA_DIR defaults to "data")
#
# Result:
#   DATA_DIR/LJSpeech-1.1/metadata.csv, DATA_DIR/LJSpeech-1.1/wavs/*.wav      (13,100 clips, 22050 Hz)
#   DATA_DIR/LJSpeech-1.1/filelists/ljs_audio_text_train_filelist.txt        (all but the last 100)
#   DATA_DIR/LJSpeech-1.1/filelists/ljs_audio_text_val_filelist.txt          (the last 100)
# Filelist lines are "wavs/<id>.wav|<normalized text>", paths relative to the dataset folder, so
# config.json can say  "data": {"dataset_path": "DATA_DIR/LJSpeech-1.1",
#   "training_files": "filelists/ljs_audio_text_train_filelist.txt",
#   "validation_files": "filelists/ljs_audio_text_val_filelist.txt"}
# Steps already done (download, extraction) are skipped on a second run. Needs ~2.6 GB of disk.
# No internet? `python -m scripts.make_demo_corpus --output data/demo` builds a small corpus offline.
set -euo pipefail

URL="https://data.keithito.com/data/speech/LJSpeech-1.1.tar.bz2"
DATA_DIR="${1:-data}"
ARCHIVE="$DATA_DIR/LJSpeech-1.1.tar.bz2"
CORPUS="$DATA_DIR/LJSpeech-1.1"
VAL_LINES=100

die() { echo "ERROR: $*" >&2; exit 1; }

mkdir -p "$DATA_DIR"

if [[ -f "$CORPUS/metadata.csv" ]]; then
    echo "LJSpeech already extracted in $CORPUS, skipping download and extraction"
else
    if [[ -f "$ARCHIVE" ]]; then
        echo "archive already downloaded: $ARCHIVE"
    else
        echo "downloading $URL (about 2.6 GB) to $ARCHIVE"
        # Download to a .part file so an interrupted download is never taken for a finished one.
        if command -v curl >/dev/null 2>&1; then
            curl -fL --retry 3 -C - -o "$ARCHIVE.part" "$URL" || die "download failed: $URL"
        elif command -v wget >/dev/null 2>&1; then
            wget -c -O "$ARCHIVE.part" "$URL" || die "download failed: $URL"
        else
            die "neither curl nor wget is installed"
        fi
        mv "$ARCHIVE.part" "$ARCHIVE"
    fi
    echo "extracting $ARCHIVE into $DATA_DIR"
    tar -xjf "$ARCHIVE" -C "$DATA_DIR" || die "cannot extract $ARCHIVE (corrupt download? delete it and rerun)"
    [[ -f "$CORPUS/metadata.csv" ]] || die "$ARCHIVE did not contain LJSpeech-1.1/metadata.csv"
fi

TOTAL=$(wc -l < "$CORPUS/metadata.csv")
(( TOTAL > VAL_LINES )) || die "$CORPUS/metadata.csv has $TOTAL lines, need more than $VAL_LINES"
[[ "$TOTAL" -eq 13100 ]] || echo "warning: $CORPUS/metadata.csv has $TOTAL lines, LJSpeech-1.1 has 13100" >&2

mkdir -p "$CORPUS/filelists"
TRAIN_LIST="$CORPUS/filelists/ljs_audio_text_train_filelist.txt"
VAL_LIST="$CORPUS/filelists/ljs_audio_text_val_filelist.txt"
# metadata.csv: id|raw text|normalized text. Use the normalized text, falling back to the raw text.
TO_FILELIST='{ sub(/\r$/, ""); text = ($3 != "") ? $3 : $2; print "wavs/" $1 ".wav|" text }'
head -n $(( TOTAL - VAL_LINES )) "$CORPUS/metadata.csv" | awk -F'|' "$TO_FILELIST" > "$TRAIN_LIST"
tail -n "$VAL_LINES" "$CORPUS/metadata.csv" | awk -F'|' "$TO_FILELIST" > "$VAL_LIST"

echo "wrote $TRAIN_LIST ($(wc -l < "$TRAIN_LIST") lines) and $VAL_LIST ($(wc -l < "$VAL_LIST") lines)"
echo "set data.dataset_path to $CORPUS in config.json (filelist paths are relative to it)"
