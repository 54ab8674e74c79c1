<!--
  LongBench-style document QA as the Prompt Cache harness writes it: the schema opens the <user> turn,
  lists the documents as modules and stops; every prompt imports some of the documents, writes its
  question and closes the turn with </user>. Documents: Wikipedia paragraphs from HotpotQA (dev,
  distractor setting), CC BY-SA 4.0, lightly cleaned.
-->
<schema name="longbench-qa">

    <system>
        Below is a dialogue between a person and an AI assistant. The assistant is helpful, polite and
        honest, and it answers questions about documents accurately and concisely. It does not make up
        facts: when the documents do not contain the answer, it says so.
    </system>

    <user>
        For the upcoming interaction, I would like you to answer a question about the documents below.

        <module name="bernhard-botel">
            Title: Bernhard Bötel
            Bernhard Bötel (1883–1953) was a German operatic tenor and actor who had an active
            career in Germany and Austria during the first half of the 20th century. He made
            recordings for several record labels during the early years of the recording industry,
            including His Master's Voice, Odeon Records, Polydor Records, Tri-Ergon, and Vox
            Records. On the stage he sang a variety of roles in operas and operettas from leading
            parts to comprimario roles. His stage repertoire included Belmonte in Wolfgang Amadeus
            Mozart's "Die Entführung aus dem Serail", Chapelou in Adolphe Adam's "Le postillon de
            Lonjumeau", Count Almaviva in Gioachino Rossini's "The Barber of Seville", Daniel in
            Franz Lehár's "The Merry Widow", the Duke of Mantua in Giuseppe Verdi's "Rigoletto",
            Gabriel von Eisenstein in Johann Strauss II's "Die Fledermaus", Indigo in Strauss'
            "Indigo und die vierzig Räuber", Jeník in Bedřich Smetana's "The Bartered Bride",
            Paolino in Domenico Cimarosa's "Il matrimonio segreto", Pâris in Jacques Offenbach's "La
            belle Hélène", Pietro in Franz von Suppé's "Boccaccio", and Wilhelm Meister in Ambroise
            Thomas' "Mignon".
        </module>

        <module name="giuseppe-verdi-film">
            Title: Giuseppe Verdi (film)
            Giuseppe Verdi is a 1938 Italian biographical film directed by Carmine Gallone and
            starring Fosco Giachetti, Gaby Morlay and Germana Paolieri. The film portrays the life
            of the composer Giuseppe Verdi (1813-1901). The casting of Giachetti as Verdi was
            intended to emphasise the composer's patriotism, as he had recently played patriotic
            roles in films such as "The White Squadron". The film was made at the Cinecittà Studios
            in Rome. The film is also known by the alternative title The Life of Giuseppe Verdi.
        </module>

        <module name="parma-airport">
            Title: Parma Airport
            Parma Airport (Italian: "Aeroporto di Parma" , IATA: PMF, ICAO: LIMP ) is located 1.3 NM
            northwest of Parma, a city in the Emilia-Romagna region of Italy. The airport was opened
            on 5 May 1991. It is also known as Giuseppe Verdi Airport or Parma "Giuseppe Verdi"
            Airport, named after Giuseppe Verdi.
        </module>

        <module name="giuseppe-verdi">
            Title: Giuseppe Verdi
            Giuseppe Fortunino Francesco Verdi (9 or 10 October 1813 – 27 January 1901) was an
            Italian opera composer.
        </module>

        <module name="teatro-giuseppe-verdi">
            Title: Teatro Giuseppe Verdi
            Teatro Giuseppe Verdi (the Giuseppe Verdi Theatre) is a small opera house located in a
            wing of the Rocca dei Marchesi Pallavicino on the Piazza Giuseppe Verdi in Busseto,
            Italy, a town closely associated with the life of the opera composer, Giuseppe Verdi.
            From the 13th century, the “rocca” or “fortress” was the family’s palace; it is now the
            city hall after being acquired by the municipality in 1856. The theatre opened on 15
            August 1868 and seats 300.
        </module>

        <module name="ambroise-thomas">
            Title: Ambroise Thomas
            Charles Louis Ambroise Thomas (5 August 1811 – 12 February 1896) was a French composer,
            best known for his operas "Mignon" (1866) and "Hamlet" (1868, after Shakespeare) and as
            Director of the Conservatoire de Paris from 1871 till his death.
        </module>

        <module name="armand-castelmary">
            Title: Armand Castelmary
            Armand Castelmary, real name Comte Armand de Castan, born Toulouse 16 August 1834, died
            New York City 10 February 1897, was a French operatic bass. He created roles in three
            major premieres at the Paris Opera – Don Diego in "L'Africaine" by Meyerbeer (1865), the
            Monk in Verdi's "Don Carlos" (1867), and Horatio in Ambroise Thomas's "Hamlet" (1868).
            Castelmary also appeared at opera houses in England and the United States, and died
            onstage at the Metropolitan Opera House, New York, during a performance of "Martha" by
            Friedrich von Flotow.
        </module>

        <module name="ferdinando-provesi">
            Title: Ferdinando Provesi
            Ferdinando Angelo Maria Provesi (1770 – 1833) was a native of Parma, Italy. He was
            regarded as one of the greatest Italian opera composers of the era. Provesi is best
            known as being an early tutor of Giuseppe Verdi when he was the "Maestro di cappella"
            (master of music) at the St. Bartolomeo cathedral in Busseto (the town very close to Le
            Roncole, the village where Verdi was born.) Provesi was also director of the municipal
            music school and local Philharmonic Society. He began teaching Verdi in 1824 when the
            future composer was 11 years old.
        </module>

        <module name="list-of-major-opera-composers">
            Title: List of major opera composers
            This list provides a guide to opera composers, as determined by their presence on a
            majority of compiled lists of significant opera composers. (See the "Lists Consulted"
            section for full details.) The composers run from Jacopo Peri, who wrote the first ever
            opera in late 16th century Italy, to John Adams, one of the leading figures in the
            contemporary operatic world. The brief accompanying notes offer an explanation as to why
            each composer has been considered major. Also included is a section about major women
            opera composers, compiled from the same lists. For an introduction to operatic history,
            see opera. The organisation of the list is by birthdate.
        </module>

        <module name="verdi-king-of-melody">
            Title: Verdi, the King of Melody
            Giuseppe Verdi, released theatrically in the USA as The Life and Music of Giuseppe Verdi
            and on video as Verdi, the King of Melody, is a 1953 Italian biographical film starring
            Pierre Cressoy and directed by Raffaello Matarazzo. It is based on adult life events of
            the composer Giuseppe Verdi. The film was a commercial success, grossing over 957
            million lire at the Italian box office.
        </module>

        Answer the question based on the documents above, in as few words as possible.

</schema>
